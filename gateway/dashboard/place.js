// Placing a model: a model picker (the models this cluster lists, or any Hugging Face id),
// the placement previews for it (every sharding × backend × node count) with the reason for
// each one that is impossible, one click to launch a preview; and a direct placement
// (sharding and least node count), whose refusal says why.

import { h, bytes, showError } from './dom.js';
import { api } from './api.js';
import { nodeLabel } from './cluster.js';

let current = null;

function previewTitle(p) {
  return `${p.sharding} · ${p.instance_meta} · ${p.node_count} node${p.node_count === 1 ? '' : 's'}`;
}

function previewItem(v, p, status) {
  const item = h('li', {
    class: `preview ${p.placement ? 'possible' : 'impossible'}`,
    'data-sharding': p.sharding, 'data-meta': p.instance_meta, 'data-count': p.node_count,
  }, h('strong', {}, previewTitle(p)));
  if (!p.placement) {
    const e = p.error || {};
    item.append(h('p', { class: 'reason' }, e.message || 'impossible', e.code ? h('code', {}, ` ${e.code}`) : null));
    return item;
  }
  item.append(h('ul', { class: 'plan' }, p.placement.ranks.map((r, i) =>
    h('li', {}, `rank ${i}: ${nodeLabel(v, r.node)}, layers ${r.start_layer}–${r.end_layer - 1}`))));
  const error = h('p', { class: 'error', role: 'alert', hidden: true });
  const launch = h('button', { type: 'button', class: 'launch' }, 'Launch');
  launch.setAttribute('aria-label', `Launch ${p.model_id} as ${previewTitle(p)}`);
  launch.addEventListener('click', async () => {
    launch.disabled = true;
    showError(error, null);
    try {
      const created = await api('POST', '/instance', { instance: p });
      status.textContent = `Created instance ${created.instance_id} of ${created.model_id}.`;
    } catch (e) {
      showError(error, `Could not launch: ${e.message}`);
    } finally {
      launch.disabled = false;
    }
  });
  item.append(launch, error);
  return item;
}

/** Wires the place section; `getView()` gives the latest cluster view. */
export function setup(getView) {
  const form = document.getElementById('preview-form');
  const input = document.getElementById('place-model');
  const list = document.getElementById('previews');
  const summary = document.getElementById('preview-summary');
  const error = document.getElementById('place-error');
  const status = document.getElementById('place-status');
  // The model named, with the last outcome cleared; null (and why, shown) when none is.
  const named = () => {
    const model = input.value.trim();
    showError(error, null);
    status.textContent = '';
    if (!model) {
      showError(error, 'Name a model first (one from the list, or a Hugging Face id).');
      input.focus();
    }
    return model || null;
  };
  form.addEventListener('submit', async (event) => {
    event.preventDefault();
    const model = named();
    if (!model) return;
    summary.textContent = `Computing placements of ${model}…`;
    list.replaceChildren();
    try {
      current = await api('GET', `/instance/previews?model_id=${encodeURIComponent(model)}`);
    } catch (e) {
      summary.textContent = '';
      showError(error, `No placements for ${model}: ${e.message}`);
      return;
    }
    draw(getView(), status);
  });
  const direct = document.getElementById('place-form');
  direct.addEventListener('submit', async (event) => {
    event.preventDefault();
    const model = named();
    if (!model) return;
    const request = {
      model_id: model,
      sharding: document.getElementById('place-sharding').value,
      min_nodes: Number(document.getElementById('place-min-nodes').value) || 1,
    };
    try {
      const created = await api('POST', '/place_instance', request);
      status.textContent = `Created instance ${created.instance_id} of ${created.model_id}.`;
    } catch (e) {
      showError(error, `Could not place ${model}: ${e.message}`);
    }
  });
}

function draw(v, status) {
  const list = document.getElementById('previews');
  const summary = document.getElementById('preview-summary');
  if (!current) return;
  const m = current.model || {};
  const possible = current.previews.filter((p) => p.placement).length;
  const shape = shapeText(current.shape);
  summary.textContent = `${current.model_id}${shape ? ` (${shape})` : ''}: ` +
    `${m.n_layers ?? '?'} layers, ${bytes(m.storage_bytes)}; ` +
    `${possible} of ${current.previews.length} placements possible.`;
  list.replaceChildren(...current.previews.map((p) => previewItem(v, p, status)));
}

/** A count of parameters: 135 M, 30.5 B. */
function count(n) {
  if (typeof n !== 'number' || !isFinite(n)) return '?';
  if (n >= 1e9) return `${(n / 1e9).toFixed(1)} B`;
  return `${Math.round(n / 1e6)} M`;
}

/**
 * A model's shape in words: its family and parameters and, for a Mixture of Experts, how many
 * run per token ("qwen3_moe, 30.5 B parameters, 3.3 B active: 8 of 128 experts per token").
 */
export function shapeText(shape) {
  if (!shape || !shape.family) return '';
  let text = `${shape.family}, ${count(shape.parameters)} parameters`;
  if (shape.experts) {
    text += `, ${count(shape.active_parameters)} active: ` +
      `${shape.experts_per_token} of ${shape.experts} experts per token`;
  }
  return text;
}

/** The models the picker offers (GET /v1/models' entries), with their shape where known. */
export function setModels(models) {
  const options = document.getElementById('model-options');
  options.replaceChildren(...models.map((m) => {
    const shape = shapeText(m.shape);
    return h('option', shape ? { value: m.id, label: `${m.id} (${shape})` } : { value: m.id });
  }));
}
