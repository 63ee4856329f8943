// The matrix (home page): rows model family x checkpoint, columns device x precision x
// topology x mode; each square the newest cell's status for the filter, linking to it. The
// filter lives in the page's query string, so a filtered matrix is a link. Polls every 2 s
// while a shown square is not final, else every 10 s.
'use strict';

// branches: '' counts each repository's designated branches, 'all' every branch (protocols.md §1).
const FILTERS = ['repository', 'branch', 'commit', 'model_family', 'status', 'branches'];

function currentFilter() {
  const q = new URLSearchParams(location.search);
  const f = {};
  for (const k of FILTERS) f[k] = q.get(k) || '';
  return f;
}

function setOptions(select, values, chosen) {
  const keep = select.options[0];
  select.replaceChildren(keep);
  for (const v of values) {
    const o = el('option', null, v === '' ? '(none)' : v);
    o.value = v;
    select.appendChild(o);
  }
  if (chosen && !values.includes(chosen)) {
    const o = el('option', null, chosen);
    o.value = chosen;
    select.appendChild(o);
  }
  select.value = chosen;
}

function renderFilters(data, f) {
  const form = document.getElementById('filters');
  const repos = data.choices.repositories;
  setOptions(form.repository, repos.map((r) => r.repository), f.repository);
  const branches = new Set();
  for (const r of repos) {
    if (!f.repository || r.repository === f.repository) r.branches.forEach((b) => branches.add(b));
  }
  setOptions(form.branch, [...branches].sort(), f.branch);
  setOptions(form.model_family, data.choices.model_families, f.model_family);
  form.commit.value = f.commit;
  form.status.value = f.status;
  form.branches.value = f.branches === 'all' ? 'all' : '';
}

/** Column header: device and precision on one line, topology and mode below. */
function columnHeader(c) {
  const th = el('th', 'col');
  th.dataset.key = c.key;
  th.appendChild(el('div', null, `${c.device} ${c.precision}`));
  th.appendChild(el('div', 'muted', `${topologyText(c.topology)}`));
  th.appendChild(el('div', 'muted', c.mode));
  return th;
}

function square(q) {
  const a = el('a', `square status-${q.status}`, q.status);
  a.href = `cell.html?id=${encodeURIComponent(q.cell)}`;
  a.dataset.cell = q.cell;
  a.dataset.status = q.status;
  a.title = `${q.readiness}: cell ${q.cell.slice(0, 12)}\n${q.repository}\n${q.branch} @ ${q.commit.slice(0, 10)}\n` +
            `${when(q.created_at)}\n${q.cells} cell${q.cells === 1 ? '' : 's'} in this square`;
  if (q.waiting_reason) {
    // A queued cell says why it waits where it is shown, not only on its page.
    a.title += `\nwaiting: ${q.waiting_reason}`;
    a.dataset.waiting = q.waiting_reason;
    a.classList.add('waiting');
  }
  return a;
}

function renderMatrix(data) {
  const head = document.querySelector('#matrix thead');
  const body = document.querySelector('#matrix tbody');
  const tr = el('tr');
  tr.appendChild(el('th', null, 'model family / checkpoint'));
  tr.appendChild(el('th', null, 'readiness'));
  for (const c of data.columns) tr.appendChild(columnHeader(c));
  head.replaceChildren(tr);
  const rows = [];
  let live = false;
  for (const r of data.rows) {
    const row = el('tr');
    row.dataset.family = r.model_family;
    const name = el('td', 'rowname');
    name.appendChild(el('div', null, r.model_family));
    // The last two parts: checkpoints usually sit at <name>/checkpoint.
    const ckpt = el('div', 'muted mono', r.checkpoint.path.split('/').slice(-2).join('/') || r.checkpoint.path);
    ckpt.title = `${r.checkpoint.path}\n${r.checkpoint.digest}`;
    name.appendChild(ckpt);
    row.appendChild(name);
    const total = Object.values(r.counts).reduce((a, b) => a + b, 0);
    const ready = el('td');
    ready.appendChild(badge(r.readiness));
    ready.appendChild(el('div', 'muted', `${r.counts.validated || 0} / ${total} validated`));
    row.appendChild(ready);
    for (const c of data.columns) {
      const td = el('td', 'cellsq');
      const q = r.squares[c.key];
      if (q) {
        td.appendChild(square(q));
        if (!FINAL_STATES.has(q.status)) live = true;
      } else {
        td.appendChild(el('span', 'muted', '·'));
      }
      row.appendChild(td);
    }
    rows.push(row);
  }
  body.replaceChildren(...rows);
  const squares = data.rows.reduce((n, r) => n + Object.keys(r.squares).length, 0);
  document.getElementById('matrix-size').textContent =
      `${data.rows.length} rows x ${data.columns.length} columns, ${squares} squares`;
  document.getElementById('empty').hidden = data.rows.length > 0;
  return live;
}

async function loadMatrix() {
  const f = currentFilter();
  const q = new URLSearchParams();
  for (const k of FILTERS) if (f[k]) q.set(k, f[k]);
  const data = await fetchApi(`api/v1/matrix?${q}`);
  renderFilters(data, f);
  return renderMatrix(data) ? POLL_MS : IDLE_POLL_MS;
}

const refresh = poll(loadMatrix);
document.getElementById('filters').addEventListener('change', (ev) => {
  const form = ev.currentTarget;
  const q = new URLSearchParams();
  for (const k of FILTERS) {
    if (k === 'branch' && ev.target.name === 'repository') continue;  // a new repository's branches
    const v = form[k].value.trim();
    if (v) q.set(k, v);
  }
  history.replaceState(null, '', `${location.pathname}${q.toString() ? '?' + q : ''}`);
  refresh();
});
document.getElementById('filters').addEventListener('submit', (ev) => ev.preventDefault());
