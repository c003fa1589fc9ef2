// The node's own HTTP API, and its state stream (GET /events).

/** An answer that was not a success, with the API's message. */
export class ApiError extends Error {
  constructor(status, message, code) {
    super(message);
    this.status = status;
    this.code = code || null;
  }
}

/** Calls the API; resolves to the answer's JSON, or rejects with an ApiError. */
export async function api(method, path, body, signal) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
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
  if (!response.ok) throw errorOf(response.status, json, text);
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
    source = new EventSource('/events');
    source.addEventListener('state', (event) => {
      onStatus('live');
      onState(JSON.parse(event.data));
    });
    source.onopen = () => onStatus('live');
    source.onerror = () => {
      onStatus('reconnecting');
      if (source.readyState === EventSource.CLOSED) setTimeout(open, 3000);
    };
  };
  open();
}
