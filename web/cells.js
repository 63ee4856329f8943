// The cell list: id, family, branch, commit, status, created; and the agents (state, lane,
// attempts running of slots, drain reason). Polls every 2 s while any cell is not final, else
// every 10 s.
'use strict';

async function refreshCells() {
  let delay = IDLE_POLL_MS;
  try {
    const data = await fetchApi('api/v1/cells?limit=200');
    const body = document.querySelector('#cells tbody');
    body.replaceChildren();
    for (const c of data.cells) {
      const link = el('a', 'mono', c.id.slice(0, 12));
      link.href = `cell.html?id=${encodeURIComponent(c.id)}`;
      link.title = c.id;
      const commit = el('span', 'mono', c.commit.slice(0, 10));
      commit.title = `${c.repository} @ ${c.commit}`;
      body.appendChild(row([link, c.model_family, c.branch, commit, badge(c.status), when(c.created_at)]));
      if (!FINAL_STATES.has(c.status)) delay = POLL_MS;
    }
    document.getElementById('empty').hidden = data.cells.length > 0;
    await refreshAgents();
    showError(null);
    setRefresh(`updated ${when(new Date().toISOString())}`);
  } catch (err) {
    showError(err);
    delay = POLL_MS;
  }
  setTimeout(refreshCells, delay);
}

async function refreshAgents() {
  const data = await fetchApi('api/v1/agents');
  const body = document.querySelector('#agents tbody');
  body.replaceChildren();
  for (const a of data.agents) {
    const state = !a.attached ? 'disconnected' : a.drain_reason ? 'draining'
                : a.silent ? 'silent' : 'connected';
    const lane = (a.capabilities.labels && a.capabilities.labels.lane) || '';
    const gpus = (a.capabilities.gpus || []).map((g) => g.model).join(', ');
    body.appendChild(row([el('span', 'mono', a.id), badge(state), lane, gpus,
                          a.attached ? `${a.running} / ${a.slots}` : String(a.running),
                          a.drain_reason || '', when(a.last_seen_at)]));
  }
  document.getElementById('no-agents').hidden = data.agents.length > 0;
}

refreshCells();
