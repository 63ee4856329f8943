// One cell: summary, phases with figures, attempts, worker/build log and the evidence report.
// Polls every 2 s while the cell is not final, then fetches once more and stops.
'use strict';

const cellId = new URLSearchParams(location.search).get('id') || '';

function figureText(f) {
  const unit = f.unit && f.unit !== 'text' ? ` ${f.unit}` : '';
  const value = typeof f.value === 'number' ? String(f.value) : f.value;
  return `${f.name} = ${value}${unit}`;
}

function renderSummary(cell) {
  const s = cell.spec || {};
  const topo = s.topology || {};
  const entries = [
    ['repository', s.repository],
    ['commit', s.commit],
    ['branch', cell.labels.branch],
    ['model family', s.model_family],
    ['checkpoint', s.checkpoint ? `${s.checkpoint.path} (${s.checkpoint.digest})` : ''],
    ['reference', s.reference ? `${s.reference.path} (${s.reference.digest})` : ''],
    ['runtime', s.runtime ? `torch ${s.runtime.torch}${s.runtime.cuda ? ', CUDA ' + s.runtime.cuda : ''}, ${s.runtime.device}` : ''],
    ['topology', `tp=${topo.tp} dp=${topo.dp} pp=${topo.pp} ep=${topo.ep}`],
    ['precision / mode', `${s.precision} / ${s.mode}`],
    ['submitted', `${when(cell.created_at)}${cell.labels.submitter ? ' by ' + cell.labels.submitter : ''}`],
  ];
  if (cell.waiting_reason) entries.push(['waiting', cell.waiting_reason]);
  const dl = document.getElementById('summary');
  dl.replaceChildren();
  for (const [k, v] of entries) {
    dl.appendChild(el('dt', null, k));
    dl.appendChild(el('dd', k === 'commit' ? 'mono' : null, v));
  }
  const status = document.getElementById('status');
  status.replaceWith(Object.assign(badge(cell.status), { id: 'status' }));
}

function renderPhases(cell) {
  const body = document.querySelector('#phases tbody');
  body.replaceChildren();
  const latest = cell.attempts[cell.attempts.length - 1];
  document.getElementById('phases-attempt').textContent = latest ? `(attempt ${latest.number})` : '';
  const reported = new Set(cell.phases.map((p) => p.phase));
  for (const p of cell.phases) {
    const figures = el('ul', 'figures');
    for (const f of p.figures) figures.appendChild(el('li', 'mono', figureText(f)));
    const reason = el('div', null, p.reason);
    if (p.classification) reason.appendChild(el('div', 'classification', p.classification));
    const duration = p.duration_ms === null ? '' : `${p.duration_ms} ms`;
    body.appendChild(row([p.phase, badge(p.status), duration, figures, reason]));
  }
  for (const name of (cell.spec.phases || [])) {
    if (!reported.has(name)) body.appendChild(row([name, el('span', 'muted', 'not reported'), '', '', '']));
  }
}

function renderAttempts(cell) {
  const body = document.querySelector('#attempts tbody');
  body.replaceChildren();
  for (const a of cell.attempts) {
    const reason = a.retry_of ? `retry of attempt id ${a.retry_of}${a.reason ? '; ' + a.reason : ''}` : a.reason;
    body.appendChild(row([a.number, badge(a.state), a.agent || '', when(a.created_at),
                          when(a.started_at), when(a.ended_at), a.cancel_reason && !a.reason ? a.cancel_reason : reason]));
  }
}

async function refreshText(path, id) {
  try {
    document.getElementById(id).textContent = await fetchApi(path, true);
  } catch (err) {
    document.getElementById(id).textContent = String(err.message || err);
  }
}

async function refreshCell() {
  let final = false;
  try {
    const cell = await fetchApi(`api/v1/cells/${encodeURIComponent(cellId)}`);
    renderSummary(cell);
    renderPhases(cell);
    renderAttempts(cell);
    const stream = document.getElementById('log-stream').value;
    await Promise.all([
      refreshText(`api/v1/cells/${encodeURIComponent(cellId)}/log?stream=${stream}`, 'log'),
      refreshText(`api/v1/cells/${encodeURIComponent(cellId)}/report`, 'report'),
    ]);
    final = FINAL_STATES.has(cell.status);
    showError(null);
    setRefresh(final ? '' : `live, updated ${when(new Date().toISOString())}`);
  } catch (err) {
    showError(err);
    final = err.message.startsWith('404');
  }
  if (!final) setTimeout(refreshCell, POLL_MS);
}

document.getElementById('cell-id').textContent = cellId;
document.getElementById('report-link').href = `api/v1/cells/${encodeURIComponent(cellId)}/report`;
document.getElementById('log-stream').addEventListener('change', () => {
  const stream = document.getElementById('log-stream').value;
  refreshText(`api/v1/cells/${encodeURIComponent(cellId)}/log?stream=${stream}`, 'log');
});
refreshCell();
