// Downloads per node and model, with progress: each node's `download/<model>/<part>` records (bytes
// done and total, files, the file now, the state, the error of a failed one).

import { h, bytes } from './dom.js';
import { label } from './cluster.js';

/** Draws every node's downloads of `v` into `box`; `empty` shows when there is none. */
export function render(box, empty, v) {
  const rows = [];
  for (const node of v.nodes) {
    for (const d of node.downloads) {
      const pct = d.total ? Math.floor((100 * (d.done || 0)) / d.total) : d.state === 'complete' ? 100 : 0;
      rows.push(h('tr', { 'data-node': node.id, 'data-model': d.model, 'data-state': d.state || '' },
        h('td', {}, label(node), node.alive ? '' : ' (dead)'),
        // A rank's node downloads its part of a model (`download/<model>/<part>` records).
        h('td', {}, d.part ? `${d.model} (${d.part})` : d.model),
        h('td', { class: `dl-state ${d.state || ''}` }, d.state || '?'),
        h('td', {}, h('progress', { max: d.total || 1, value: d.state === 'complete' ? d.total || 1 : d.done || 0 }),
          ` ${pct}% · ${bytes(d.done || 0)} / ${bytes(d.total || 0)}`),
        h('td', {}, d.files === undefined ? '' : `${d.files_complete || 0}/${d.files}`),
        h('td', { class: d.error ? 'problem' : 'muted' }, d.error || d.file || '')));
    }
  }
  box.replaceChildren(...rows);
  empty.hidden = rows.length > 0;
  box.closest('table').hidden = rows.length === 0;
}
