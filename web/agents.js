// The agents: state, lane, the node's memory, GPUs with memory, how attempts are isolated, attempts running of
// slots and their cells, drain reason, last seen. Polls every 10 s.
'use strict';

function gib(bytes) {
  return `${(bytes / 2 ** 30).toFixed(0)} GiB`;
}

async function loadAgents() {
  const data = await fetchApi('api/v1/agents');
  const rows = [];
  for (const a of data.agents) {
    const state = !a.attached ? 'disconnected' : a.drain_reason ? 'draining'
                : a.silent ? 'silent' : 'connected';
    const caps = a.capabilities || {};
    const lane = (caps.labels && caps.labels.lane) || '';
    const gpus = el('ul', 'figures');
    for (const g of caps.gpus || []) {
      // Protobuf's JSON: int64 as strings, members at their default (index 0) left out.
      const mem = Number(g.memory_bytes || 0);
      gpus.appendChild(el('li', null, `#${g.index || 0} ${g.model || 'GPU'}${mem ? ', ' + gib(mem) : ''}`));
    }
    if (!(caps.gpus || []).length) gpus.appendChild(el('li', 'muted', 'none'));
    // How the agent isolates attempts (its `sandbox` and `cgroup` labels, protocols.md §3.2).
    const isolation = el('ul', 'figures');
    for (const key of ['sandbox', 'cgroup']) {
      const value = (caps.labels && caps.labels[key]) || '';
      const item = el('li', value && !value.startsWith('none') ? null : 'muted',
                      `${key}: ${value || 'not reported'}`);
      item.dataset.isolation = key;
      isolation.appendChild(item);
    }
    const runs = el('div');
    for (const id of a.running_cells || []) { runs.appendChild(cellLink(id)); runs.appendChild(el('br')); }
    // The node's memory the scheduler places cells by (docs/scheduling.md "Memory").
    const memory = Number(caps.memory_bytes || 0);
    const r = row([el('span', 'mono', a.id), badge(state), lane,
                   memory ? gib(memory) : el('span', 'muted', 'not reported'), gpus, isolation,
                   a.attached ? `${a.running} / ${a.slots}` : String(a.running),
                   runs, a.drain_reason || '', when(a.last_seen_at)]);
    r.dataset.agent = a.id;
    rows.push(r);
  }
  document.querySelector('#agents tbody').replaceChildren(...rows);
  document.getElementById('no-agents').hidden = data.agents.length > 0;
  return IDLE_POLL_MS;
}

poll(loadAgents);
