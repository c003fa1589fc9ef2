// The topology: nodes as a graph (name, OS, memory used/total, backends, alive or dead) with
// each verified edge labelled by the interface kind and the address it was verified at; and
// the same as a list, which narrow screens show instead of the graph.

import { h, s, bytes } from './dom.js';
import { kindName, label, memoryUsed, nodeLabel } from './cluster.js';

const BOX_W = 196;
const BOX_H = 120;

/** Centres of `n` boxes: one in the middle, two side by side, more around an ellipse. */
function layout(n, width, height) {
  if (n === 1) return [[width / 2, height / 2]];
  if (n === 2) return [[width * 0.25, height / 2], [width * 0.75, height / 2]];
  const rx = width / 2 - BOX_W / 2 - 10;
  const ry = height / 2 - BOX_H / 2 - 10;
  return Array.from({ length: n }, (_, i) => {
    const a = -Math.PI / 2 + (2 * Math.PI * i) / n;
    return [width / 2 + rx * Math.cos(a), height / 2 + ry * Math.sin(a)];
  });
}

/** Where the segment from `from` to the centre `to` enters the box around `to`. */
function entry(from, to) {
  const dx = from[0] - to[0];
  const dy = from[1] - to[1];
  const t = Math.min(
    dx === 0 ? Infinity : BOX_W / 2 / Math.abs(dx),
    dy === 0 ? Infinity : BOX_H / 2 / Math.abs(dy),
  );
  return [to[0] + dx * t, to[1] + dy * t];
}

function profileLines(node) {
  const p = node.profile;
  if (!p) return ['no profile yet'];
  return [
    `${p.os || '?'} ${p.os_version || ''}`.trim(),
    `${bytes(memoryUsed(p))} / ${bytes(p.memory_total)} used`,
    (p.backends || []).join(', ') || 'no backend',
    p.version ? `shoal ${p.version} (protocol ${p.protocol})` : 'release unknown',
  ];
}

function edgeText(edge) {
  const ip = edge.ip || (edge.rdma ? 'RDMA' : '?');
  return `${kindName(edge.remote_kind)} ${ip}`;
}

function graph(v) {
  const width = 800;
  const height = v.nodes.length <= 2 ? 240 : 460;
  const centres = layout(v.nodes.length, width, height);
  const at = new Map(v.nodes.map((n, i) => [n.id, centres[i]]));
  const lines = s('g', { class: 'edges' });
  const labels = s('g', { class: 'edge-labels' });
  const drawn = new Set();
  for (const node of v.nodes) {
    for (const edge of node.edges) {
      const a = at.get(edge.from);
      const b = at.get(edge.to);
      if (!a || !b) continue;
      const dead = !node.alive || !v.byId.get(edge.to).alive;
      const pair = [edge.from, edge.to].sort().join(' ');
      if (!drawn.has(pair)) {
        drawn.add(pair);
        lines.append(s('line', { x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: dead ? 'dead' : null }));
      }
      // The label sits near the end it names: `to`, reached at that address.
      const [ex, ey] = entry(a, b);
      const len = Math.hypot(a[0] - b[0], a[1] - b[1]) || 1;
      const [ux, uy] = [(a[0] - b[0]) / len, (a[1] - b[1]) / len];
      const back = Math.min(70, len / 4);
      const x = ex + ux * back - uy * 9;
      const y = ey + uy * back + ux * 9;
      labels.append(
        s('text', {
          x, y, class: 'edge-label', 'text-anchor': 'middle',
          'data-from': edge.from, 'data-to': edge.to, 'data-ip': edge.ip || '',
          'data-kind': edge.remote_kind || '',
        },
        s('title', {}, `${nodeLabel(v, edge.from)} reaches ${nodeLabel(v, edge.to)} at ${edge.ip} ` +
          `(${edge.remote_interface || '?'}, ${kindName(edge.remote_kind)})`),
        edgeText(edge)),
      );
    }
  }
  const boxes = v.nodes.map((node) => {
    const [cx, cy] = at.get(node.id);
    const x = cx - BOX_W / 2;
    const y = cy - BOX_H / 2;
    const text = [label(node) + (node.me ? ' (this node)' : ''), ...profileLines(node)];
    return s('g', {
      class: `node ${node.alive ? 'alive' : 'dead'}${node.me ? ' me' : ''}`,
      'data-node-id': node.id, 'data-alive': node.alive ? 'true' : 'false',
    },
    s('rect', { x, y, width: BOX_W, height: BOX_H, rx: 8 }),
    text.map((line, i) => s('text', { x: x + 12, y: y + 22 + i * 18, class: i === 0 ? 'name' : null }, line)),
    s('circle', { cx: x + 16, cy: y + 22 + text.length * 18 - 5, r: 5, class: 'dot' }),
    s('text', { x: x + 27, y: y + 22 + text.length * 18, class: 'liveness' }, node.alive ? 'alive' : 'dead'));
  });
  return s('svg', {
    viewBox: `0 0 ${width} ${height}`, role: 'img',
    'aria-label': `${v.nodes.length} nodes and their links`,
  }, lines, labels, boxes);
}

function list(v) {
  return v.nodes.map((node) =>
    h('li', { class: node.alive ? 'alive' : 'dead', 'data-node-id': node.id },
      h('strong', {}, label(node)), node.me ? ' (this node) ' : ' ',
      h('span', { class: 'liveness' }, node.alive ? 'alive' : 'dead'),
      h('div', {}, profileLines(node).join(' · ')),
      node.edges.length
        ? h('div', { class: 'muted' }, node.edges.map((e) => `→ ${nodeLabel(v, e.to)}: ${edgeText(e)}`).join('; '))
        : h('div', { class: 'muted' }, 'no verified link yet')));
}

/** Draws the topology of `v` into `graphBox` and `listBox`. */
export function render(graphBox, listBox, v) {
  graphBox.replaceChildren(v.nodes.length ? graph(v) : h('p', {}, 'No node in the state yet.'));
  listBox.replaceChildren(...list(v));
}
