// The node's own HTTP API, and its state stream (GET /events).

/** An answer that was not a success, with the API's message. */
export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code || null;
  }
}

const KEY_ITEM = 'shoal-api-key';

/** The API key this browser keeps for the node ('' when none). */
export function apiKey() {
  try {
    return localStorage.getItem(KEY_ITEM) || '';
  } catch {
    return '';
  }
}

/** Keeps `key` for later visits ('' forgets it). */
export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_ITEM, key);
    else localStorage.removeItem(KEY_ITEM);
  } catch {
    // Private mode without storage: the key lasts until the page closes.
  }
}

/** `headers` plus the key's Authorization header, when a key is kept. */
export function withKey(headers = {}) {
  const key = apiKey();
  return key ? { ...headers, authorization: `Bearer ${key}` } : { ...headers };
}

const keyListeners = [];

/** Calls `listener(message)` when the node refuses the kept key (or asks for one). */
export function onKeyNeeded(listener) {
  keyListeners.push(listener);
}

/** Tells the key listeners when an answer is 401 or 403 for a key. */
export function checkKey(error) {
  if (error.status === 401 || (error.status === 403 && error.code === 'admin_key_required')) {
    keyListeners.forEach((l) => l(error.message));
  }
  return error;
}

/** Calls the API; resolves to the answer's JSON, or rejects with an ApiError. */
export async function api(method, path, body, signal) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: withKey(body === undefined ? {} : { 'content-type': 'application/json' }),
      body: body === undefined ? undefined : JSON.stringify(body),
      signal,
    });
  } catch (e) {
    throw new ApiError(0, `cannot reach this node (${e.message})`);
  }
  const text = await response.text();
  let json = null;
  try {
    json = JSON.parse(text);
  } catch {
    // Not JSON: the text is the message.
  }
  if (!response.ok) throw checkKey(errorOf(response.status, json, text));
  return json;
}

/** The ApiError of an error answer (OpenAI's shape: {error: {message, code}}). */
export function errorOf(status, json, text) {
  const e = json && json.error;
  const message = (e && (e.message || e)) || text || `HTTP ${status}`;
  return new ApiError(status, String(message), e && e.code);
}

/**
 * Follows the state stream: `onState(state)` for each state, `onStatus('live' |
 * 'reconnecting')` as the connection comes and goes. EventSource retries by itself; when
 * it gives up (the node refused the stream), a new one is opened after a pause.
 */
export function follow(onState, onStatus) {
  let source;
  const open = () => {
    // EventSource cannot send headers: the stream takes the key in its query.
    const key = apiKey();
    source = new EventSource(key ? `/events?access_token=${encodeURIComponent(key)}` : '/events');
    source.addEventListener('state', (event) => {
      onStatus('live');
      onState(JSON.parse(event.data));
    });
    source.onopen = () => onStatus('live');
    source.onerror = () => {
      onStatus('reconnecting');
      if (source.readyState === EventSource.CLOSED) {
        // Refused: find out whether for want of a key (the listeners then ask for one).
        api('GET', '/state').catch(() => {});
        setTimeout(open, 3000);
      }
    };
  };
  open();
}
