// The cell list: id, family, branch, commit, status, created. Polls every 2 s while any cell
// is not final, else every 10 s.
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
    showError(null);
    setRefresh(`updated ${when(new Date().toISOString())}`);
  } catch (err) {
    showError(err);
    delay = POLL_MS;
  }
  setTimeout(refreshCells, delay);
}

refreshCells();
