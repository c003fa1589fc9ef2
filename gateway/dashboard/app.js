// The dashboard: follows this node's state stream and draws each part from it.

import { api, follow, onKeyNeeded, setApiKey, apiKey } from './api.js';
import { view, label } from './cluster.js';
import * as topology from './topology.js';
import * as instances from './instances.js';
import * as place from './place.js';
import * as chat from './chat.js';
import * as downloads from './downloads.js';

const el = (id) => document.getElementById(id);
let latest = view({});
let modelsKey = null;

async function refreshModels() {
  try {
    const models = await api('GET', '/v1/models');
    const data = (models && models.data) || [];
    place.setModels(data);
    chat.setModels(data.filter((m) => m.ready).map((m) => ({
      id: m.id,
      vision: ((m.shape && m.shape.capabilities) || []).includes('vision'),
    })));
  } catch (e) {
    el('chat-error').hidden = false;
    el('chat-error').textContent = `Could not list the models: ${e.message}`;
  }
}

function onState(state) {
  latest = view(state);
  const me = latest.byId.get(latest.me);
  el('node-name').textContent = me ? label(me) : '';
  topology.render(el('topology-graph'), el('node-list'), latest);
  instances.render(el('instance-list'), el('no-instances'), latest);
  downloads.render(el('download-rows'), el('no-downloads'), latest);
  // The model lists change with the instances and their readiness.
  const key = latest.instances.map((i) => `${i.instance_id}:${i.status}`).join(',');
  if (key !== modelsKey) {
    modelsKey = key;
    refreshModels();
  }
}

function onStatus(status) {
  const conn = el('connection');
  conn.textContent = status === 'live' ? 'live' : 'reconnecting…';
  conn.className = `connection ${status}`;
}

// A node started with --api-key: ask for the key once, keep it, and start again with it.
onKeyNeeded((message) => {
  const form = el('key-form');
  if (!form.hidden) return;
  form.hidden = false;
  el('key-message').textContent = apiKey()
    ? `This key is not accepted: ${message}`
    : 'This node needs an API key (an admin key for the whole dashboard).';
  el('key-input').focus();
});
el('key-form').addEventListener('submit', (event) => {
  event.preventDefault();
  setApiKey(el('key-input').value.trim());
  window.location.reload();
});

place.setup(() => latest);
chat.setup();
follow(onState, onStatus);
