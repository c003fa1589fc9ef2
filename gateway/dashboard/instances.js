// The instances: model, sharding, ranks and the layers each node holds, every rank's runner
// state (downloading, loading, warming up, ready, failed with its reason), and a delete
// button. Cards are kept across states (only their contents are redrawn), so a keyboard
// user's focus on a button survives the cluster changing.

import { h, short, showError } from './dom.js';
import { api } from './api.js';
import { nodeLabel } from './cluster.js';

const cards = new Map();

const STATES = {
  idle: 'starting', connecting: 'joining the ring', connected: 'in the ring', loading: 'loading',
  loaded: 'loaded', warming_up: 'warming up', ready: 'ready', running: 'generating',
  shutting_down: 'stopping', shutdown: 'stopped', failed: 'failed',
};

/** The runner cell of a rank: its state, with progress or the failure's reason. */
function runnerCell(v, instance, rank) {
  const runner = rank.runner;
  const node = v.byId.get(rank.node);
  const download = node && node.downloads.find((d) => d.model === instance.model || d.model === instance.model_id);
  if ((!runner || runner.state === 'idle') && download && download.state === 'downloading') {
    const pct = download.total ? Math.floor((100 * download.done) / download.total) : 0;
    return h('td', { class: 'runner downloading', 'data-state': 'downloading' },
      `downloading ${pct}%`, h('progress', { max: download.total || 1, value: download.done || 0 }));
  }
  if (!runner) return h('td', { class: 'runner', 'data-state': 'none' }, 'not reported yet');
  const name = STATES[runner.state] || runner.state;
  if (runner.state === 'loading') {
    return h('td', { class: 'runner loading', 'data-state': 'loading' },
      `${name} ${runner.done}/${runner.total} layers`,
      h('progress', { max: runner.total || 1, value: runner.done || 0 }));
  }
  if (runner.state === 'failed') {
    return h('td', { class: 'runner failed', 'data-state': 'failed' }, `${name}: ${runner.reason}`);
  }
  return h('td', { class: `runner ${runner.state}`, 'data-state': runner.state }, name);
}

function layersCell(rank, total) {
  const bar = h('span', { class: 'layers-bar' }, h('span', { class: 'layers-fill' }));
  const fill = bar.firstChild;
  fill.style.left = `${(100 * rank.start_layer) / total}%`;
  fill.style.width = `${(100 * (rank.end_layer - rank.start_layer)) / total}%`;
  return h('td', {}, `${rank.start_layer}–${rank.end_layer - 1}`, ' ', bar);
}

function body(v, instance) {
  const ranks = instance.ranks || [];
  const total = Math.max(1, ...ranks.map((r) => r.end_layer));
  const meta = [
    instance.sharding, instance.instance_meta,
    `${ranks.length} rank${ranks.length === 1 ? '' : 's'}`, `epoch ${instance.epoch}`,
    `id ${instance.instance_id}`,
  ];
  const parts = [h('p', { class: 'muted' }, meta.join(' · '))];
  if (instance.excluded && instance.excluded.length) {
    parts.push(h('p', { class: 'muted' },
      `placed again without ${instance.excluded.map((id) => nodeLabel(v, id)).join(', ')}`));
  }
  const problem = instance.failure || (instance.error && instance.error.message);
  if (problem) parts.push(h('p', { class: 'problem', role: 'status' }, problem));
  if (ranks.length) {
    parts.push(h('table', { class: 'ranks' },
      h('thead', {}, h('tr', {}, ['Rank', 'Node', 'Layers', 'Runner', 'Queued'].map((t) => h('th', {}, t)))),
      h('tbody', {}, ranks.map((rank) => h('tr', { 'data-rank': rank.rank, 'data-node': rank.node },
        h('td', {}, String(rank.rank)),
        h('td', {}, nodeLabel(v, rank.node)),
        layersCell(rank, total),
        runnerCell(v, instance, rank),
        h('td', {}, rank.queued_requests === null || rank.queued_requests === undefined ? '–' : String(rank.queued_requests)))))));
  }
  return parts;
}

function card(id) {
  const title = h('h3', {});
  const badge = h('span', { class: 'badge' });
  const content = h('div', {});
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const remove = h('button', { type: 'button', class: 'danger' }, 'Delete');
  remove.addEventListener('click', async () => {
    remove.disabled = true;
    remove.textContent = 'Deleting…';
    showError(error, null);
    try {
      await api('DELETE', `/instance/${encodeURIComponent(id)}`);
    } catch (e) {
      showError(error, `Could not delete: ${e.message}`);
      remove.disabled = false;
      remove.textContent = 'Delete';
    }
  });
  const el = h('article', { class: 'instance', 'data-instance-id': id },
    h('header', {}, title, badge, remove), content, error);
  return { el, title, badge, content, remove };
}

/** Draws the instances of `v` into `box`; `empty` shows when there is none. */
export function render(box, empty, v) {
  const seen = new Set();
  for (const instance of v.instances) {
    const id = instance.instance_id;
    seen.add(id);
    let c = cards.get(id);
    if (!c) {
      c = card(id);
      cards.set(id, c);
    }
    c.title.textContent = instance.model_id || instance.model;
    c.badge.textContent = instance.status;
    c.badge.className = `badge ${instance.status}`;
    c.el.dataset.status = instance.status;
    c.el.dataset.epoch = String(instance.epoch);
    c.remove.setAttribute('aria-label', `Delete instance ${short(id)} of ${instance.model_id}`);
    c.content.replaceChildren(...body(v, instance));
    if (c.el.parentNode !== box) box.append(c.el);
  }
  for (const [id, c] of cards) {
    if (!seen.has(id)) {
      c.el.remove();
      cards.delete(id);
    }
  }
  // The order of the state (by id); moved only when it differs, as a move drops focus.
  const order = v.instances.map((i) => cards.get(i.instance_id).el);
  if (order.some((el, i) => box.children[i] !== el)) box.replaceChildren(...order);
  empty.hidden = v.instances.length > 0;
}
