// Gatehouse dashboard helpers shared by every page. No build step, no external resources. Data
// is always inserted as text (never as HTML).
'use strict';

const POLL_MS = 2000;
const IDLE_POLL_MS = 10000;
const FINAL_STATES = new Set(['passed', 'failed', 'error', 'lost', 'cancelled', 'timed_out', 'blocked']);

const TOKEN_KEY = 'gatehouse-token';

/** The bearer token for this tab (sessionStorage), or ''. */
function apiToken() {
  try { return sessionStorage.getItem(TOKEN_KEY) || ''; } catch (e) { return ''; }
}

/** {Authorization: "Bearer <token>"} when this tab has a token, else {}. */
function authHeaders() {
  const token = apiToken();
  return token ? { Authorization: `Bearer ${token}` } : {};
}

/**
 * Makes `a` open controller path `path`: a plain link, but with a token the click fetches it
 * with the token (a browser sends no header on a link) and opens the bytes as a blob.
 */
function apiLink(a, path) {
  a.href = path;
  a.addEventListener('click', async (ev) => {
    if (!apiToken()) return;
    ev.preventDefault();
    try {
      const res = await fetch(path, { cache: 'no-store', headers: authHeaders() });
      if (!res.ok) throw new Error(`${res.status}: ${await res.text()}`);
      const type = (res.headers.get('Content-Type') || '').startsWith('text/') ? 'text/plain; charset=utf-8'
                                                                             : 'application/octet-stream';
      const url = URL.createObjectURL(new Blob([await res.arrayBuffer()], { type }));
      window.open(url, '_blank');
      setTimeout(() => URL.revokeObjectURL(url), 60000);
    } catch (err) {
      showError(err);
    }
  });
  return a;
}

/**
 * Shows, once, a form at the top of the page asking for an API token with scope read; the
 * token is kept for this tab only (sessionStorage) and the page reloads with it. A form rather
 * than window.prompt, which blocks the page (and a headless browser) until answered.
 */
function askForToken(message) {
  if (document.getElementById('token-form')) return;
  const form = el('form', 'token-form');
  form.id = 'token-form';
  const label = el('label', null, `${message}: `);
  const input = el('input');
  input.type = 'password';
  input.name = 'token';
  input.autocomplete = 'off';
  input.size = 40;
  label.appendChild(input);
  form.appendChild(label);
  form.appendChild(Object.assign(el('button', null, 'use token'), { type: 'submit' }));
  form.addEventListener('submit', (ev) => {
    ev.preventDefault();
    try { sessionStorage.setItem(TOKEN_KEY, input.value.trim()); } catch (e) { /* private mode */ }
    location.reload();
  });
  document.querySelector('main').prepend(form);
  input.focus();
}

/**
 * Fetches JSON (or text with asText) from the controller; throws Error(message) on failure.
 * A 401 or 403 also asks for a token (askForToken).
 */
async function fetchApi(path, asText) {
  const res = await fetch(path, { cache: 'no-store', headers: authHeaders() });
  if (res.status === 401 || res.status === 403) {
    askForToken(res.status === 401 ? 'This controller needs an API token with scope "read"'
                                    : 'This token may not read here; another token with scope "read"');
  }
  const body = asText ? await res.text() : await res.json().catch(() => ({}));
  if (!res.ok) {
    const msg = asText ? body : (body.error || res.statusText);
    throw new Error(`${res.status}: ${msg}`);
  }
  return body;
}

/** Creates an element with optional class and text. */
function el(tag, className, text) {
  const e = document.createElement(tag);
  if (className) e.className = className;
  if (text !== undefined && text !== null) e.textContent = String(text);
  return e;
}

/** A coloured status badge. */
function badge(status) {
  return el('span', `status status-${status}`, status);
}

/** A table row from cells (strings or nodes). */
function row(cells) {
  const tr = document.createElement('tr');
  for (const c of cells) {
    const td = document.createElement('td');
    if (c instanceof Node) td.appendChild(c); else td.textContent = c ?? '';
    tr.appendChild(td);
  }
  return tr;
}

/** "2025-01-02T03:04:05.678Z" -> local "2025-01-02 04:04:05"; empty for null. */
function when(ts) {
  if (!ts) return '';
  const d = new Date(ts);
  if (isNaN(d)) return ts;
  const pad = (n) => String(n).padStart(2, '0');
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ` +
         `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

function showError(err) {
  const p = document.getElementById('error');
  if (!p) return;
  p.hidden = !err;
  p.textContent = err ? String(err.message || err) : '';
}

function setRefresh(text) {
  const r = document.getElementById('refresh');
  if (r) r.textContent = text;
}

/** The page's query parameter `name`, or ''. */
function param(name) {
  return new URLSearchParams(location.search).get(name) || '';
}

/** A link to a cell page, showing the first 12 hex of its id. */
function cellLink(id, text) {
  const a = el('a', 'mono', text || id.slice(0, 12));
  a.href = `cell.html?id=${encodeURIComponent(id)}`;
  a.title = id;
  return a;
}

/** A figure's value as text: numbers with up to 4 significant digits (integers whole). */
function fmt(v) {
  if (typeof v !== 'number') return String(v);
  if (Number.isInteger(v)) return String(v);
  if (v === 0) return '0';
  const a = Math.abs(v);
  return a >= 1e-3 && a < 1e6 ? String(Number(v.toPrecision(4))) : v.toExponential(2);
}

/** "1.2 s" / "340 ms" for a duration in ms; '' for null. */
function fmtMs(ms) {
  if (ms === null || ms === undefined) return '';
  return ms >= 1000 ? `${(ms / 1000).toFixed(ms >= 10000 ? 0 : 1)} s` : `${ms} ms`;
}

/**
 * The topology as "tp=2 dp=1 pp=1 ep=1", then dp_shard, cp and etp where present (the API
 * gives them only when not 1; TopologyText in common/cell_spec.cc).
 */
function topologyText(t) {
  if (!t) return '';
  let text = `tp=${t.tp} dp=${t.dp} pp=${t.pp} ep=${t.ep}`;
  for (const d of ['dp_shard', 'cp', 'etp']) if (t[d] && t[d] !== 1) text += ` ${d}=${t[d]}`;
  return text;
}

/**
 * Runs `load` now and again after the delay in ms it returns (POLL_MS after an error; null:
 * stop), showing its error or the time of the update; the page is marked loaded
 * (body[data-loaded], for tests) after the first run. Returns a function that runs it at once.
 */
function poll(load) {
  let timer = null;
  const run = async () => {
    clearTimeout(timer);
    let delay = POLL_MS;
    try {
      delay = await load();
      showError(null);
      setRefresh(`updated ${when(new Date().toISOString())}`);
    } catch (err) {
      showError(err);
    }
    document.body.dataset.loaded = 'true';
    if (delay) timer = setTimeout(run, delay);
  };
  run();
  return run;
}
