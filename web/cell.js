// One cell: summary, the phase strip (status, duration, key figures; details folded below),
// the reason of each non-PASS phase, plots, the greedy decode beside upstream's, attempts, the
// live log (followed by byte offset: only new chunks are fetched), artifacts and the report.
// Polls every 2 s while the cell is not final, then once more and stops.
'use strict';

const cellId = param('id');
const log = { stream: 'worker', attempt: null, offset: 0, busy: false };
let plotsFor = '';  // the attempt and phase state the plots were drawn for

function renderSummary(cell) {
  const s = cell.spec || {};
  const reference = s.kind === 'reference';
  const entries = [
    ['kind', reference ? 'reference cell: upstream (transformers) run on the checkpoint; its bundle is the reference of validation cells' : ''],
    ['repository', s.repository],
    ['commit', s.commit],
    ['branch', cell.labels.branch],
    ['model family', s.model_family],
    ['checkpoint', s.checkpoint ? `${s.checkpoint.path} (${s.checkpoint.digest})` : ''],
    ['reference', s.reference && !s.reference.cell ? `${s.reference.path} (${s.reference.digest})` : ''],
    ['reference cell', s.reference && s.reference.cell ? s.reference.cell : ''],
    ['runtime', s.runtime ? `torch ${s.runtime.torch}${s.runtime.cuda ? ', CUDA ' + s.runtime.cuda : ''}, ${s.runtime.device}` : ''],
    ['topology', topologyText(s.topology)],
    ['precision / mode', reference ? '' : `${s.precision} / ${s.mode}`],
    ['submitted', `${when(cell.created_at)}${cell.labels.submitter ? ' by ' + cell.labels.submitter : ''}`],
  ];
  if (s.control) entries.push(['control', s.control]);
  if (cell.waiting_reason) entries.push(['waiting', cell.waiting_reason]);
  if (cell.memory_estimate) {
    const bases = [...new Set(cell.memory_estimate.processes.map((p) => p.basis))].join('; ');
    entries.push(['memory estimate', `${cell.memory_estimate.summary} (${bases})`]);
  }
  const dl = document.getElementById('summary');
  dl.replaceChildren();
  for (const [k, v] of entries) {
    if (v === undefined || v === '') continue;
    dl.appendChild(el('dt', null, k));
    const linked = k === 'control' || k === 'reference cell';
    const dd = el('dd', k === 'commit' || linked ? 'mono' : null);
    if (linked) dd.appendChild(cellLink(v, v)); else dd.textContent = v;
    if (k === 'waiting') dd.id = 'waiting';
    dl.appendChild(dd);
  }
  document.getElementById('status').replaceWith(Object.assign(badge(cell.status), { id: 'status' }));
}

function renderPhases(cell) {
  const strip = document.getElementById('phase-strip');
  const details = document.getElementById('phase-details');
  const reasons = document.getElementById('reasons');
  const latest = cell.attempts[cell.attempts.length - 1];
  document.getElementById('phases-attempt').textContent = latest ? `(attempt ${latest.number})` : '';
  const open = new Set([...details.querySelectorAll('details[open]')].map((d) => d.dataset.phase));
  const byName = {};
  for (const p of cell.phases) byName[p.phase] = p;
  const names = [...new Set([...(cell.spec.phases || []), ...cell.phases.map((p) => p.phase)])];
  const missing = FINAL_STATES.has(cell.status) ? 'not reported' : 'not yet';
  const boxes = [], folds = [], why = [];
  for (const name of names) {
    const p = byName[name];
    const status = p ? p.status : FINAL_STATES.has(cell.status) ? 'not-reported' : 'pending';
    const box = el('a', `phase phase-${status}`);
    box.href = `#phase-${name}`;
    box.dataset.phase = name;
    box.dataset.status = status;
    box.appendChild(el('div', 'phase-name', name));
    box.appendChild(el('div', 'phase-status', p ? `${p.status} ${fmtMs(p.duration_ms)}` : missing));
    for (const k of p ? keyFigures(p) : []) box.appendChild(el('div', 'phase-figure mono', k));
    box.addEventListener('click', () => { const d = document.getElementById(`phase-${name}`); if (d) d.open = true; });
    boxes.push(box);
    if (!p) continue;
    if (p.status !== 'PASS' && p.status !== 'RUNNING') {
      const li = el('li');
      li.dataset.phase = name;
      li.appendChild(badge(p.status));
      li.appendChild(el('strong', null, ` ${name}: `));
      li.appendChild(document.createTextNode(p.reason || '(no reason given)'));
      if (p.classification) li.appendChild(el('span', 'classification', ` (${p.classification.replace(/_/g, ' ')})`));
      why.push(li);
    }
    const d = el('details');
    d.id = `phase-${name}`;
    d.dataset.phase = name;
    d.open = open.has(name);
    const sum = el('summary');
    sum.appendChild(el('strong', null, name));
    sum.appendChild(document.createTextNode(' '));
    sum.appendChild(badge(p.status));
    const took = fmtMs(p.duration_ms);
    sum.appendChild(el('span', 'muted', ` ${took ? took + ', ' : ''}${p.figures.length} figure${p.figures.length === 1 ? '' : 's'}`));
    d.appendChild(sum);
    const t = el('table', 'figure-table');
    for (const f of p.figures) {
      t.appendChild(row([el('span', 'mono', f.name), el('span', 'mono', fmt(f.value)), f.unit === 'text' ? '' : f.unit]));
    }
    d.appendChild(t);
    folds.push(d);
  }
  strip.replaceChildren(...boxes);
  details.replaceChildren(...folds);
  reasons.replaceChildren(...why);
}

async function renderPlots(cell) {
  const latest = cell.attempts[cell.attempts.length - 1];
  const key = `${latest ? latest.id : ''}:${cell.phases.map((p) => p.phase + p.status).join(',')}:${(cell.artifacts || []).length}`;
  if (key === plotsFor) return;
  plotsFor = key;
  const figs = await evidencePlots(cell);
  document.getElementById('plots').replaceChildren(...figs);
  document.getElementById('plots-section').hidden = figs.length === 0;
}

function renderDecode(cell) {
  const p = cell.phases.find((x) => x.phase === 'decode');
  const rows = p ? decodeRows(p) : [];
  const body = document.querySelector('#decode tbody');
  body.replaceChildren(...rows.map((r) => {
    const tr = row([r.input ? `${r.prompt}: ${r.input}` : String(r.prompt), el('pre', 'decoded', r.ours),
                    el('pre', 'decoded', r.upstream),
                    r.same === null ? el('span', 'muted', 'not compared') : r.same ? badge('PASS') : el('span', 'status status-FAIL', 'differs')]);
    tr.dataset.same = String(r.same);
    return tr;
  }));
  document.getElementById('decode-section').hidden = rows.length === 0;
  // The gate compares every prompt; the evidence keeps the ids of the first and the text of
  // those whose bundle has text.
  const m = p ? figureMap(p) : {};
  const prompts = cell.phases.find((x) => x.phase === 'inference');
  const count = prompts ? (figureMap(prompts).prompts || {}).value : undefined;
  document.getElementById('decode-summary').textContent = m.tokens_total
      ? `(${m.tokens_matched ? m.tokens_matched.value : 0} / ${m.tokens_total.value} tokens equal over ${count ?? 'all'} prompts; ` +
        `${rows.length} shown: the evidence keeps the first prompt's ids and the text where the bundle has it)`
      : '';
}

function renderAttempts(cell) {
  const body = document.querySelector('#attempts tbody');
  body.replaceChildren(...cell.attempts.map((a) => {
    const reason = a.retry_of ? `retry of attempt id ${a.retry_of}${a.reason ? '; ' + a.reason : ''}` : a.reason;
    return row([a.number, badge(a.state), a.agent || '', when(a.created_at), when(a.started_at), when(a.ended_at),
                a.cancel_reason && !a.reason ? a.cancel_reason : reason]);
  }));
}

function renderArtifacts(cell) {
  const numbers = {};
  for (const a of cell.attempts) numbers[a.id] = a.number;
  const body = document.querySelector('#artifacts tbody');
  body.replaceChildren(...(cell.artifacts || []).map((a) => {
    let name = a.name;
    if (!a.expired_at) name = apiLink(el('a', null, a.name), `api/v1/artifacts/${encodeURIComponent(a.digest)}`);
    const size = a.size >= 1 << 20 ? `${(a.size / (1 << 20)).toFixed(1)} MiB` : `${a.size} B`;
    return row([String(numbers[a.attempt_id] ?? a.attempt_id), name, a.expired_at ? `${size} (removed ${when(a.expired_at)})` : size,
                el('span', 'mono', a.digest.slice(0, 19))]);
  }));
  document.getElementById('no-artifacts').hidden = (cell.artifacts || []).length > 0;
}

/** Appends the log's new bytes: asks from the offset already shown (X-Log-Next-Offset). */
async function followLog(cell) {
  if (log.busy) return;
  const latest = cell.attempts[cell.attempts.length - 1];
  if (!latest) return;
  const pre = document.getElementById('log');
  if (log.attempt !== latest.number) {  // a new attempt: its own log from the start
    log.attempt = latest.number;
    log.offset = 0;
    log.decoder = new TextDecoder();
    pre.textContent = '';
  }
  log.busy = true;
  try {
    const res = await fetch(`api/v1/cells/${encodeURIComponent(cellId)}/log?stream=${encodeURIComponent(log.stream)}` +
                            `&attempt=${log.attempt}&offset=${log.offset}`,
                            { cache: 'no-store', headers: authHeaders() });
    if (!res.ok) {
      document.getElementById('log-state').textContent = log.offset ? '' : (await res.text());
      return;
    }
    const bytes = new Uint8Array(await res.arrayBuffer());
    const next = Number(res.headers.get('X-Log-Next-Offset'));
    log.offset = Number.isFinite(next) ? next : log.offset + bytes.length;
    if (bytes.length) {
      const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
      pre.appendChild(document.createTextNode(log.decoder.decode(bytes, { stream: true })));
      if (stick) pre.scrollTop = pre.scrollHeight;
    }
    pre.dataset.offset = String(log.offset);
    document.getElementById('log-state').textContent =
        `${log.offset} bytes${FINAL_STATES.has(cell.status) ? '' : ', following'}`;
  } finally {
    log.busy = false;
  }
}

async function fillCompareCandidates(cell) {
  const list = document.getElementById('compare-candidates');
  if (list.childElementCount) return;
  const data = await fetchApi('api/v1/cells?limit=200');
  const opts = [];
  if (cell.spec.control) opts.push([cell.spec.control, 'the control']);
  for (const c of data.cells) {
    if (c.id === cell.id || c.model_family !== cell.spec.model_family) continue;
    opts.push([c.id, `${c.branch} @ ${c.commit.slice(0, 10)}, ${c.status}`]);
  }
  list.replaceChildren(...opts.map(([id, label]) => Object.assign(el('option', null, label), { value: id })));
}

let cellNow = null;

// One log stream per rank beyond rank 0 (worker.rank1, ...; docs/protocols.md §3.1), offered
// once the cell's topology is known.
function addRankStreams(cell) {
  const select = document.getElementById('log-stream');
  const t = cell.spec.topology || {};
  // pp x dp x dp_shard x cp x tp: ep adds no rank (docs/protocols.md §3.1).
  const world = (t.tp || 1) * (t.dp || 1) * (t.pp || 1) * (t.dp_shard || 1) * (t.cp || 1);
  for (let r = 1; r < world && r < 64; ++r) {
    const name = `worker.rank${r}`;
    if (select.querySelector(`option[value="${name}"]`)) continue;
    select.appendChild(Object.assign(el('option', null, name), { value: name }));
  }
}

async function refreshCell() {
  let final = false;
  try {
    const cell = await fetchApi(`api/v1/cells/${encodeURIComponent(cellId)}`);
    cellNow = cell;
    renderSummary(cell);
    addRankStreams(cell);
    renderPhases(cell);
    renderAttempts(cell);
    renderArtifacts(cell);
    renderDecode(cell);
    await Promise.all([renderPlots(cell), followLog(cell), fillCompareCandidates(cell).catch(() => {})]);
    final = FINAL_STATES.has(cell.status);
    if (final) {
      document.getElementById('report').textContent =
          await fetchApi(`api/v1/cells/${encodeURIComponent(cellId)}/report`, true).catch((e) => String(e.message));
    }
    showError(null);
    setRefresh(final ? '' : `live, updated ${when(new Date().toISOString())}`);
  } catch (err) {
    showError(err);
    final = String(err.message).startsWith('404');
  }
  document.body.dataset.loaded = 'true';
  if (!final) setTimeout(refreshCell, POLL_MS);
}

document.getElementById('cell-id').textContent = cellId.slice(0, 16);
document.getElementById('cell-id').title = cellId;
apiLink(document.getElementById('report-link'), `api/v1/cells/${encodeURIComponent(cellId)}/report`);
document.getElementById('log-stream').addEventListener('change', (ev) => {
  log.stream = ev.target.value;
  log.attempt = null;
  if (cellNow) followLog(cellNow);
});
document.getElementById('compare-go').addEventListener('click', () => {
  const other = document.getElementById('compare-with').value.trim();
  if (other) location.href = `compare.html?a=${encodeURIComponent(cellId)}&b=${encodeURIComponent(other)}`;
});
if (cellId) {
  refreshCell();
} else {
  showError('cell.html needs ?id=<cell id> (the cells are listed on cells.html and the matrix)');
  document.querySelectorAll('main section').forEach((s) => { s.hidden = true; });
}
