// Small DOM helpers: elements built from data (never from HTML strings, so names and
// messages from the cluster are always text), and the units the page shows.

const SVG_NS = 'http://www.w3.org/2000/svg';

function build(el, attrs, children) {
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === 'text') el.textContent = value;
    else if (key.startsWith('on')) el.addEventListener(key.slice(2), value);
    else el.setAttribute(key, value === true ? '' : String(value));
  }
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return el;
}

/** An HTML element: `h('p', {class: 'x'}, 'text', otherElement)`. */
export function h(tag, attrs = {}, ...children) {
  return build(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs = {}, ...children) {
  return build(document.createElementNS(SVG_NS, tag), attrs, children);
}

/** Bytes in GB (or MB below one GB), one decimal. */
export function bytes(n) {
  if (typeof n !== 'number' || !isFinite(n)) return '?';
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} GB`;
  return `${(n / 1e6).toFixed(1)} MB`;
}

/** The first characters of a node or instance id, as people tell them apart. */
export function short(id) {
  return String(id || '').slice(0, 8);
}

/** Shows `message` in an error box (or clears it with null). */
export function showError(box, message) {
  box.textContent = message || '';
  box.hidden = !message;
}
