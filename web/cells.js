// Every cell, newest first, 100 at a time: id, family, branch, commit, status, created. Polls
// the first page every 2 s while one of its cells is not final, else every 10 s.
'use strict';

const PAGE = 100;
let shown = PAGE;

async function loadCells() {
  let delay = IDLE_POLL_MS;
  const data = await fetchApi(`api/v1/cells?limit=${Math.min(shown, 500)}`);
  const rows = [];
  for (const c of data.cells) {
    const commit = el('span', 'mono', c.commit.slice(0, 10));
    commit.title = `${c.repository} @ ${c.commit}`;
    rows.push(row([cellLink(c.id), c.model_family, c.branch, commit, badge(c.status), when(c.created_at)]));
    if (!FINAL_STATES.has(c.status)) delay = POLL_MS;
  }
  document.querySelector('#cells tbody').replaceChildren(...rows);
  document.getElementById('empty').hidden = data.cells.length > 0;
  document.getElementById('more').hidden = data.cells.length < shown || shown >= 500;
  return delay;
}

const refreshCells = poll(loadCells);
document.getElementById('more').addEventListener('click', () => { shown += PAGE; refreshCells(); });
