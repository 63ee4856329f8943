// Small SVG plots for the cell and compare pages: lines (KL along the position, loss per step)
// and horizontal bars (ratios, differences against their bars). SVG rather than a canvas
// library so that every drawn line and bar is an element a test (and a screen reader) can
// find: each series is a <path class="series" data-name>, each bar a <rect class="bar"
// data-name data-value>. Data is inserted as text, never as markup.
'use strict';

const SVG_NS = 'http://www.w3.org/2000/svg';
const PALETTE = ['#0969da', '#cf222e', '#1a7f37', '#9a6700', '#8250df', '#bf3989', '#1b7c83', '#6e7781'];

function svgEl(tag, attrs, text) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text !== undefined) e.textContent = String(text);
  return e;
}

/** Ticks for [lo, hi]: about `n` round numbers. */
function ticks(lo, hi, n) {
  if (!(hi > lo)) return [lo];
  const step0 = (hi - lo) / n;
  const mag = Math.pow(10, Math.floor(Math.log10(step0)));
  const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= step0) || mag * 10;
  const out = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + step * 1e-9; v += step) out.push(Number(v.toPrecision(12)));
  return out;
}

/**
 * A line plot. series: [{name, points: [[x, y], ...]}]; opts: {title, xLabel, yLabel, logY,
 * hline: {y, label}}. With logY, values <= 0 are drawn at the smallest positive value shown
 * (KL of identical logits is 0). Returns a <figure> holding the SVG and a legend.
 */
function linePlot(series, opts) {
  const W = 640, H = 260, L = 64, R = 12, T = 12, B = 40;
  const fig = el('figure', 'plot');
  fig.dataset.kind = 'line';
  if (opts.title) fig.appendChild(el('figcaption', null, opts.title));
  const all = series.flatMap((s) => s.points);
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img' });
  if (opts.title) svg.appendChild(svgEl('title', {}, opts.title));
  if (!all.length) {
    svg.appendChild(svgEl('text', { x: W / 2, y: H / 2, 'text-anchor': 'middle', class: 'axis' }, 'no data'));
    fig.appendChild(svg);
    return fig;
  }
  const xs = all.map((p) => p[0]);
  let x0 = Math.min(...xs), x1 = Math.max(...xs);
  if (x1 === x0) x1 = x0 + 1;
  const finite = all.map((p) => p[1]).filter((y) => Number.isFinite(y));
  let floor = 0;
  const tx = (v) => (opts.logY ? Math.log10(Math.max(v, floor)) : v);
  if (opts.logY) {
    const pos = finite.filter((y) => y > 0);
    floor = pos.length ? Math.min(...pos) : 1e-12;
  }
  const ys = finite.map(tx);
  if (opts.hline) ys.push(tx(opts.hline.y));
  let y0 = ys.length ? Math.min(...ys) : 0, y1 = ys.length ? Math.max(...ys) : 1;
  if (!opts.logY) y0 = Math.min(y0, 0);
  if (y1 === y0) { y1 = y0 + 1; }
  const pad = (y1 - y0) * 0.05;
  y0 -= opts.logY ? pad : 0;
  y1 += pad;
  const px = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const py = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  // Axes and ticks.
  svg.appendChild(svgEl('line', { x1: L, y1: H - B, x2: W - R, y2: H - B, class: 'axis' }));
  svg.appendChild(svgEl('line', { x1: L, y1: T, x2: L, y2: H - B, class: 'axis' }));
  for (const v of ticks(x0, x1, 6)) {
    if (opts.integerX && !Number.isInteger(v)) continue;
    svg.appendChild(svgEl('text', { x: px(v), y: H - B + 14, 'text-anchor': 'middle', class: 'tick' }, fmt(v)));
  }
  // Log scale: a label per decade, or at round values inside the decade when the range spans
  // less than two.
  const wholeDecades = opts.logY && Math.floor(y1) - Math.ceil(y0) >= 1;
  for (const v of ticks(y0, y1, 4)) {
    const label = !opts.logY ? fmt(v) : wholeDecades ? `1e${Math.round(v)}` : fmt(Number(Math.pow(10, v).toPrecision(2)));
    if (wholeDecades && Math.abs(v - Math.round(v)) > 1e-9) continue;
    svg.appendChild(svgEl('line', { x1: L, y1: py(v), x2: W - R, y2: py(v), class: 'grid' }));
    svg.appendChild(svgEl('text', { x: L - 6, y: py(v) + 4, 'text-anchor': 'end', class: 'tick' }, label));
  }
  if (opts.xLabel) svg.appendChild(svgEl('text', { x: (L + W - R) / 2, y: H - 6, 'text-anchor': 'middle', class: 'axis-label' }, opts.xLabel));
  if (opts.yLabel) {
    svg.appendChild(svgEl('text', { x: 12, y: (T + H - B) / 2, 'text-anchor': 'middle', class: 'axis-label',
                                    transform: `rotate(-90 12 ${(T + H - B) / 2})` }, opts.yLabel));
  }
  if (opts.hline) {
    svg.appendChild(svgEl('line', { x1: L, y1: py(tx(opts.hline.y)), x2: W - R, y2: py(tx(opts.hline.y)), class: 'hline' }));
    svg.appendChild(svgEl('text', { x: W - R - 4, y: py(tx(opts.hline.y)) - 4, 'text-anchor': 'end', class: 'tick' }, opts.hline.label));
  }
  const legend = el('ul', 'legend');
  series.forEach((s, i) => {
    const color = s.color || PALETTE[i % PALETTE.length];
    const pts = s.points.filter((p) => Number.isFinite(p[1]));
    const d = pts.map((p, j) => `${j ? 'L' : 'M'}${px(p[0]).toFixed(1)},${py(tx(p[1])).toFixed(1)}`).join('');
    const path = svgEl('path', { d, class: 'series', stroke: color, 'data-name': s.name, 'data-points': pts.length });
    if (s.dashed) path.setAttribute('stroke-dasharray', '5 3');
    path.appendChild(svgEl('title', {}, s.name));
    svg.appendChild(path);
    if (pts.length <= 40) {
      for (const p of pts) svg.appendChild(svgEl('circle', { cx: px(p[0]), cy: py(tx(p[1])), r: 2.5, fill: color, class: 'point' }));
    }
    const li = el('li', null, s.name);
    li.style.setProperty('--swatch', color);
    legend.appendChild(li);
  });
  fig.appendChild(svg);
  if (series.length > 1 || opts.legend) fig.appendChild(legend);
  return fig;
}

/**
 * Horizontal bars. bars: [{name, value, bar?, label?}]; opts: {title, unit, refLine: {x,
 * label}, logX}. A bar with `bar` (its threshold) is red when value exceeds it. Returns a
 * <figure>.
 */
function barPlot(bars, opts) {
  const rowH = 24, L = 230, R = 90, T = 8, B = 28, W = 640;
  const H = T + B + rowH * Math.max(bars.length, 1);
  const fig = el('figure', 'plot');
  fig.dataset.kind = 'bars';
  if (opts.title) fig.appendChild(el('figcaption', null, opts.title));
  const svg = svgEl('svg', { viewBox: `0 0 ${W} ${H}`, width: W, height: H, role: 'img' });
  if (opts.title) svg.appendChild(svgEl('title', {}, opts.title));
  const vals = bars.flatMap((b) => [b.value, b.bar]).filter((v) => Number.isFinite(v));
  if (opts.refLine) vals.push(opts.refLine.x);
  const tx = (v) => (opts.logX ? Math.log10(Math.max(v, 1e-300)) : v);
  let lo = opts.logX ? Math.min(...vals.filter((v) => v > 0).map(tx)) - 0.5 : Math.min(0, ...vals);
  let hi = Math.max(...vals.map(tx)) * (opts.logX ? 1 : 1.08);
  if (opts.logX) hi += 0.3;
  if (!(hi > lo)) hi = lo + 1;
  const px = (v) => L + ((tx(v) - lo) / (hi - lo)) * (W - L - R);
  bars.forEach((b, i) => {
    const y = T + i * rowH;
    svg.appendChild(svgEl('text', { x: L - 6, y: y + rowH / 2 + 4, 'text-anchor': 'end', class: 'tick' }, b.name));
    const over = Number.isFinite(b.bar) && !(b.value <= b.bar);
    const x0 = opts.logX ? L : px(Math.min(0, b.value));
    const x1 = Number.isFinite(b.value) ? px(b.value) : x0;
    const rect = svgEl('rect', { x: Math.min(x0, x1), y: y + 4, width: Math.max(Math.abs(x1 - x0), 1), height: rowH - 8,
                                 class: over ? 'bar bar-over' : 'bar', 'data-name': b.name, 'data-value': b.value });
    rect.appendChild(svgEl('title', {}, `${b.name} = ${fmt(b.value)}${opts.unit ? ' ' + opts.unit : ''}`));
    svg.appendChild(rect);
    if (Number.isFinite(b.bar)) {
      svg.appendChild(svgEl('line', { x1: px(b.bar), y1: y + 1, x2: px(b.bar), y2: y + rowH - 1, class: 'threshold' }));
    }
    svg.appendChild(svgEl('text', { x: W - R + 6, y: y + rowH / 2 + 4, class: 'tick' },
                          b.label || `${fmt(b.value)}${Number.isFinite(b.bar) ? ' / ' + fmt(b.bar) : ''}`));
  });
  if (opts.refLine) {
    const x = px(opts.refLine.x);
    svg.appendChild(svgEl('line', { x1: x, y1: T, x2: x, y2: H - B, class: 'hline' }));
    svg.appendChild(svgEl('text', { x, y: H - B + 14, 'text-anchor': 'middle', class: 'tick' }, opts.refLine.label));
  }
  fig.appendChild(svg);
  return fig;
}
