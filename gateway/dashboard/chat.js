// Chat: pick a running model, stream the answer (OpenAI's chat completions, streamed), stop
// it (POST /v1/cancel/{id}), see the time to first token and tokens per second; a model's
// thinking (`reasoning_content`) is shown apart from its answer. A model that sees images
// (`capabilities` holds "vision") takes one image with a message, chosen or pasted, sent as
// an OpenAI `image_url` part holding a data URL.

import { h, showError } from './dom.js';
import { errorOf, withKey, checkKey } from './api.js';

const history = [];
let running = null;
/** The ready models that accept images, by id. */
const vision = new Set();
/** The image to send with the next message: `{ url }`, a data URL, or null. */
let attached = null;

function el(id) {
  return document.getElementById(id);
}

function bubble(role, text, image) {
  const content = h('div', { class: 'content' }, text || '');
  const thumb = image ? h('img', { class: 'thumb', src: image, alt: 'the image sent' }) : null;
  const item = h('div', { class: `message ${role}` }, h('div', { class: 'role' }, role), thumb, content);
  el('chat-log').append(item);
  item.scrollIntoView({ block: 'end' });
  return { item, content };
}

/** Reads an SSE body, calling `onData(json)` for each `data:` event until `[DONE]`. */
async function readEvents(body, onData) {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let cut;
    while ((cut = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data: ')) continue;
        const data = line.slice(6);
        if (data === '[DONE]') return;
        onData(JSON.parse(data));
      }
    }
  }
}

async function send() {
  const input = el('chat-input');
  const error = el('chat-error');
  const model = el('chat-model').value;
  const text = input.value.trim();
  showError(error, null);
  if (running) return;
  if (!model) {
    showError(error, 'No running model to chat with: place one above and wait until it is ready.');
    return;
  }
  if (!text) {
    showError(error, 'Type a message first.');
    input.focus();
    return;
  }
  input.value = '';
  const image = attached && vision.has(model) ? attached.url : null;
  history.push({
    role: 'user',
    content: image
      ? [{ type: 'image_url', image_url: { url: image } }, { type: 'text', text }]
      : text,
  });
  bubble('user', text, image);
  attach(null);
  const answer = bubble('assistant', '');
  answer.item.classList.add('streaming');
  const thinking = h('pre', {});
  const thinkingBox = h('details', { class: 'thinking', open: true, hidden: true }, h('summary', {}, 'Thinking'), thinking);
  answer.item.insertBefore(thinkingBox, answer.content);
  const stats = el('chat-stats');
  stats.textContent = 'Waiting for the first token…';
  const controller = new AbortController();
  const mine = { id: null, controller, stopped: false };
  running = mine;
  el('chat-send').disabled = true;
  el('chat-stop').disabled = false;
  const started = performance.now();
  let first = null;
  let tokens = 0;
  let usage = null;
  let reply = '';
  let finish = null;
  const update = () => {
    const now = performance.now();
    const ttft = first === null ? null : first - started;
    const n = usage ? usage.completion_tokens : tokens;
    const rate = first !== null && now > first && n > 1 ? ((n - 1) * 1000) / (now - first) : null;
    stats.textContent = [
      ttft === null ? 'no token yet' : `time to first token ${Math.round(ttft)} ms`,
      rate === null ? null : `${rate.toFixed(1)} tokens/s`,
      `${n} token${n === 1 ? '' : 's'}`,
      finish ? `finished: ${finish}` : null,
    ].filter(Boolean).join(' · ');
    stats.dataset.ttftMs = ttft === null ? '' : String(Math.round(ttft));
    stats.dataset.tokensPerSecond = rate === null ? '' : rate.toFixed(2);
  };
  try {
    const response = await fetch('/v1/chat/completions', {
      method: 'POST',
      headers: withKey({ 'content-type': 'application/json' }),
      body: JSON.stringify({ model, messages: history, stream: true, stream_options: { include_usage: true } }),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.text();
      let json = null;
      try { json = JSON.parse(body); } catch { /* the text is the message */ }
      throw checkKey(errorOf(response.status, json, body));
    }
    await readEvents(response.body, (chunk) => {
      if (chunk.error) throw errorOf(0, chunk, '');
      if (chunk.id && running && !running.id) running.id = chunk.id;
      if (chunk.usage) usage = chunk.usage;
      for (const choice of chunk.choices || []) {
        const delta = choice.delta || {};
        if (delta.reasoning_content) {
          thinkingBox.hidden = false;
          thinking.textContent += delta.reasoning_content;
        }
        if (delta.content) {
          reply += delta.content;
          answer.content.textContent = reply;
        }
        if (delta.content || delta.reasoning_content) {
          if (first === null) first = performance.now();
          tokens += 1;
        }
        if (choice.finish_reason) finish = choice.finish_reason;
      }
      update();
    });
    history.push({ role: 'assistant', content: reply });
  } catch (e) {
    if (e.name === 'AbortError') {
      finish = 'stopped';
      history.push({ role: 'assistant', content: reply });
    } else {
      showError(error, `The chat failed: ${e.message}`);
      history.pop();
      if (!reply) answer.item.remove();
    }
  } finally {
    if (mine.stopped) finish = 'stopped';
    answer.item.classList.remove('streaming');
    update();
    running = null;
    el('chat-send').disabled = false;
    el('chat-stop').disabled = true;
  }
}

async function stop() {
  if (!running) return;
  running.stopped = true;
  const { id, controller } = running;
  if (!id) {
    controller.abort();
    return;
  }
  try {
    const response = await fetch(`/v1/cancel/${encodeURIComponent(id)}`, {
      method: 'POST',
      headers: withKey(),
    });
    if (!response.ok) controller.abort();
  } catch {
    controller.abort();
  }
}

/** Attaches `file` (an image File or Blob) to the next message, or nothing when null. */
function attach(file) {
  const preview = el('chat-image-preview');
  if (!file) {
    attached = null;
    el('chat-image').value = '';
    preview.hidden = true;
    preview.removeAttribute('src');
    el('chat-image-remove').hidden = true;
    return;
  }
  if (!/^image\/(png|jpeg|webp|gif)$/.test(file.type)) {
    showError(el('chat-error'), `Attach a PNG, JPEG, WebP or GIF image, not ${file.type || 'this file'}.`);
    return;
  }
  const reader = new FileReader();
  reader.onload = () => {
    attached = { url: String(reader.result) };
    preview.src = attached.url;
    preview.hidden = false;
    el('chat-image-remove').hidden = false;
    showError(el('chat-error'), null);
  };
  reader.onerror = () => showError(el('chat-error'), 'The image could not be read.');
  reader.readAsDataURL(file);
}

/** Shows the image attachment only for a model that accepts images. */
function showAttach() {
  const can = vision.has(el('chat-model').value);
  el('chat-attach').hidden = !can;
  if (!can) attach(null);
}

/** Wires the chat section. */
export function setup() {
  el('chat-model').addEventListener('change', showAttach);
  el('chat-image').addEventListener('change', (event) => attach(event.target.files[0] || null));
  el('chat-image-remove').addEventListener('click', () => attach(null));
  el('chat-input').addEventListener('paste', (event) => {
    if (!vision.has(el('chat-model').value)) return;
    const items = [...((event.clipboardData && event.clipboardData.items) || [])];
    const item = items.find((i) => i.kind === 'file' && i.type.startsWith('image/'));
    if (!item) return;
    event.preventDefault();
    attach(item.getAsFile());
  });
  el('chat-form').addEventListener('submit', (event) => {
    event.preventDefault();
    send();
  });
  el('chat-input').addEventListener('keydown', (event) => {
    if (event.key === 'Enter' && !event.shiftKey) {
      event.preventDefault();
      send();
    }
  });
  el('chat-stop').addEventListener('click', stop);
  document.addEventListener('keydown', (event) => {
    if (event.key === 'Escape' && running) stop();
  });
  el('chat-clear').addEventListener('click', () => {
    if (running) return;
    history.length = 0;
    el('chat-log').replaceChildren();
    el('chat-stats').textContent = '';
    showError(el('chat-error'), null);
  });
}

/** The models that can chat now (ready ones from GET /v1/models): `{ id, vision }` each. */
export function setModels(models) {
  const select = el('chat-model');
  const keep = select.value;
  const ids = models.map((m) => m.id);
  vision.clear();
  for (const m of models) if (m.vision) vision.add(m.id);
  select.replaceChildren(...(ids.length
    ? models.map((m) => h('option', { value: m.id }, m.vision ? `${m.id} (sees images)` : m.id))
    : [h('option', { value: '' }, 'no model is running')]));
  if (ids.includes(keep)) select.value = keep;
  showAttach();
}
