// The cluster as the page shows it, read out of one state event (the same JSON as
// GET /state): nodes with their profile, liveness, verified edges and downloads; instances.

import { short } from './dom.js';

const KINDS = { thunderbolt: 'Thunderbolt', ethernet: 'Ethernet', wifi: 'Wi-Fi', unknown: 'unknown' };

/** An interface kind as people name it. */
export function kindName(kind) {
  return KINDS[kind] || (kind ? String(kind) : 'unknown');
}

/** Records of `node` whose keys start with `prefix`, as [rest of key, value]. */
function records(node, prefix) {
  return Object.entries((node && node.records) || {})
    .filter(([key]) => key.startsWith(prefix))
    .map(([key, value]) => [key.slice(prefix.length), value]);
}

/** The page's view of a state. */
export function view(state) {
  const me = state.node_id;
  const nodes = Object.entries(state.nodes || {}).map(([id, node]) => {
    const profile = (node.records && node.records.profile) || null;
    const live = (state.liveness || {})[id];
    return {
      id,
      me: id === me,
      profile,
      alive: id === me || (live && live.alive === true) || false,
      edges: records(node, 'edge/')
        .map(([, edge]) => edge)
        .filter((edge) => edge && typeof edge === 'object' && edge.from === id),
      downloads: records(node, 'download/').map(([model, record]) => ({
        model: (record && record.model) || model,
        ...(record && typeof record === 'object' ? record : {}),
      })),
    };
  });
  nodes.sort((a, b) => label(a).localeCompare(label(b)) || a.id.localeCompare(b.id));
  const byId = new Map(nodes.map((n) => [n.id, n]));
  const instances = Object.values(state.instances || {}).sort((a, b) =>
    String(a.instance_id).localeCompare(String(b.instance_id)),
  );
  return { me, nodes, byId, instances };
}

/** A node's label: its host name and the start of its id (hosts may share a name). */
export function label(node) {
  const name = node.profile && node.profile.name;
  return name ? `${name} ${short(node.id)}` : short(node.id);
}

/** The label of node `id` in `v`, or the start of its id when the state has no profile. */
export function nodeLabel(v, id) {
  const node = v.byId.get(id);
  return node ? label(node) : short(id);
}

/** Memory in use, in bytes, from a profile. */
export function memoryUsed(profile) {
  return Math.max(0, (profile.memory_total || 0) - (profile.memory_available || 0));
}
