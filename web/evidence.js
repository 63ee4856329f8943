// Reading a cell's evidence for the cell and compare pages: the key figures of each phase,
// the plots (KL along the position, training loss per step, performance ratios, TP=N against
// TP=1) and the greedy decode beside upstream's. Figure names are the gates' own
// (docs/protocols.md §4; the gates in worker_lib/src/gates_*.cc).
'use strict';

/** The one or two figures that say most about each phase (the strip shows them). */
const KEY_FIGURES = {
  identity: ['torch_version', 'device'],
  config: ['fields_mapped', 'fields_unmapped'],
  construct: ['param_count'],
  load: ['keys_used', 'keys_missing'],
  inference: ['kl_mean', 'top1_agreement'],
  decode: ['tokens_matched', 'tokens_total'],
  packing: ['kl_max'],
  logprob_parity: ['kl_mean', 'max_abs_diff'],
  training: ['loss_rel_diff_step_1', 'grad_norm_max_rel_diff'],
  save: ['tensors_equal', 'tensors_compared'],
  parallel: ['kl_mean_vs_tp1', 'grad_nearest_bar_rel_diff', 'grad_worst_tensor_rel_diff'],
  cuda_graph: ['tokens_matched', 'steps_kl_mean'],
  performance: ['prefill_speedup', 'decode_speedup'],
  reference: ['prompts'],
};

/** {name: figure} of one phase. */
function figureMap(phase) {
  const m = {};
  for (const f of phase.figures) m[f.name] = f;
  return m;
}

/** "kl_mean 3.2e-14 nats" for the key figures present (numbers only; text is too long). */
function keyFigures(phase) {
  const m = figureMap(phase);
  const out = [];
  for (const name of KEY_FIGURES[phase.phase] || []) {
    const f = m[name];
    if (f && typeof f.value === 'number') out.push(`${name} ${fmt(f.value)}${f.unit && f.unit !== 'count' ? ' ' + f.unit : ''}`);
  }
  if (!out.length) {
    const first = phase.figures.find((f) => typeof f.value === 'number');
    if (first) out.push(`${first.name} ${fmt(first.value)}`);
  }
  return out;
}

/** The newest stored artifact named `name` of the latest attempt, or null. */
function latestArtifact(cell, name) {
  const latest = cell.attempts[cell.attempts.length - 1];
  const found = (cell.artifacts || []).filter((a) => a.name === name && (!latest || a.attempt_id === latest.id) && !a.expired_at);
  return found.length ? found[found.length - 1] : null;
}

/** KL along the position per prompt, from a gate's plot data (common/artifacts.h). */
async function klPlot(cell, artifactName, title, bar) {
  const art = latestArtifact(cell, artifactName);
  if (!art) return null;
  const data = await fetchApi(`api/v1/artifacts/${encodeURIComponent(art.digest)}`);
  const series = data.prompts.map((p) => ({ name: `prompt ${p.prompt}`, points: p.kl.map((v, t) => [t, v]) }));
  const fig = linePlot(series, { title, xLabel: 'position', yLabel: 'KL (nats), log scale', logY: true, integerX: true,
                                 hline: bar ? { y: bar, label: `kl_mean bar ${fmt(bar)}` } : null, legend: true });
  fig.dataset.plot = artifactName.startsWith('parallel/') ? 'kl_parallel' : 'kl_inference';
  const positive = data.prompts.some((p) => p.kl.some((v) => v > 0));
  if (!positive) fig.appendChild(el('p', 'muted', 'KL is 0 at every position: the logits are bit-equal.'));
  return fig;
}

/** Loss per step, ours against upstream's trace (training figures loss_step_k). */
function lossPlot(phase) {
  const ours = [], upstream = [];
  for (const f of phase.figures) {
    const k = /^loss_step_(\d+)$/.exec(f.name);
    if (k && typeof f.value === 'number') ours.push([Number(k[1]), f.value]);
    const u = /^upstream_loss_step_(\d+)$/.exec(f.name);
    if (u && typeof f.value === 'number') upstream.push([Number(u[1]), f.value]);
  }
  if (!ours.length) return null;
  ours.sort((a, b) => a[0] - b[0]);
  upstream.sort((a, b) => a[0] - b[0]);
  const series = [{ name: 'ours', points: ours }];
  if (upstream.length) series.push({ name: 'upstream', points: upstream, dashed: true });
  const fig = linePlot(series, { title: 'Training loss per step', xLabel: 'step', yLabel: 'loss (nats)', integerX: true, legend: true });
  fig.dataset.plot = 'loss';
  return fig;
}

/** Performance ratios against the peer (unit "ratio"), as bars with 1.0 marked. */
function performancePlot(phase) {
  const bars = phase.figures.filter((f) => f.unit === 'ratio' && typeof f.value === 'number')
      .map((f) => ({ name: f.name, value: f.value }));
  if (!bars.length) return null;
  const fig = barPlot(bars, { title: 'Performance against the peer (ratio; > 1 is faster, memory < 1 is smaller)',
                              refLine: { x: 1, label: '1.0 = peer' } });
  fig.dataset.plot = 'performance';
  return fig;
}

/** TP=N against TP=1: each difference beside its bar. */
function parallelPlot(phase) {
  const m = figureMap(phase);
  const v = (n) => (m[n] && typeof m[n].value === 'number' ? m[n].value : NaN);
  const bars = [];
  const thr = m.thresholds && typeof m.thresholds.value === 'string' ? m.thresholds.value : '';
  if (Number.isFinite(v('kl_mean_vs_tp1'))) bars.push({ name: 'kl_mean_vs_tp1 (nats)', value: v('kl_mean_vs_tp1') });
  if (Number.isFinite(v('kl_max_across_ranks'))) bars.push({ name: 'kl_max_across_ranks (nats)', value: v('kl_max_across_ranks') });
  if (Number.isFinite(v('max_abs_diff_vs_tp1'))) bars.push({ name: 'max_abs_diff_vs_tp1 (logits)', value: v('max_abs_diff_vs_tp1') });
  if (Number.isFinite(v('loss_rel_diff'))) bars.push({ name: 'loss_rel_diff', value: v('loss_rel_diff') });
  // grad_worst_tensor_*: the same figures under their name in evidence stored before.
  for (const [name, bar] of [['grad_nearest_bar_rel_diff', 'grad_nearest_bar'],
                             ['grad_worst_tensor_rel_diff', 'grad_worst_tensor_bar']]) {
    if (Number.isFinite(v(name))) {
      bars.push({ name, value: v(name), bar: v(bar) });
      break;
    }
  }
  if (!bars.length) return null;
  const fig = barPlot(bars.filter((b) => b.value > 0 || Number.isFinite(b.bar)),
                      { title: `TP=${v('tp') || 'N'} against TP=1 (log scale; a tick marks a bar)`, logX: true });
  if (thr) fig.appendChild(el('p', 'muted', thr));
  fig.dataset.plot = 'parallel';
  return fig;
}

/** The plots this cell's evidence supports, in phase order. */
async function evidencePlots(cell) {
  const out = [];
  const byPhase = {};
  for (const p of cell.phases) byPhase[p.phase] = p;
  const barOf = (p, n) => { const f = p && figureMap(p)[n]; return f && typeof f.value === 'number' ? f.value : null; };
  const tries = [];
  if (byPhase.inference) tries.push(klPlot(cell, 'inference/kl_by_position.json', 'KL(upstream || ours) along the position, per prompt', barOf(byPhase.inference, 'bar_kl_mean')));
  if (byPhase.training) tries.push(Promise.resolve(lossPlot(byPhase.training)));
  if (byPhase.parallel) {
    tries.push(klPlot(cell, 'parallel/kl_by_position.json', 'KL(TP=1 || TP=N) along the position, per prompt', null));
    tries.push(Promise.resolve(parallelPlot(byPhase.parallel)));
  }
  if (byPhase.performance) tries.push(Promise.resolve(performancePlot(byPhase.performance)));
  for (const t of tries) {
    try {
      const fig = await t;
      if (fig) out.push(fig);
    } catch (err) {
      out.push(el('p', 'error', `plot: ${err.message || err}`));
    }
  }
  return out;
}

/**
 * [{prompt, input, ours, upstream, same}] from the decode phase's text figures; same is null
 * when the evidence keeps nothing of upstream's to compare that prompt with.
 */
function decodeRows(phase) {
  const m = figureMap(phase);
  const prompts = new Set();
  for (const name of Object.keys(m)) {
    const k = /^(?:generated|reference)_(?:text|ids)_prompt_(\d+)$/.exec(name);
    if (k) prompts.add(Number(k[1]));
  }
  return [...prompts].sort((a, b) => a - b).map((i) => {
    const s = `_prompt_${i}`;
    // Like with like: the texts when both were decoded, else the token ids when both are kept.
    const v = (name) => (m[name + s] || {}).value;
    const texts = v('generated_text') !== undefined && v('reference_text') !== undefined;
    const ids = v('generated_ids') !== undefined && v('reference_ids') !== undefined;
    const ours = (texts || !ids ? v('generated_text') : v('generated_ids')) ?? v('generated_ids') ?? '';
    const up = (texts ? v('reference_text') : v('reference_ids')) ?? v('reference_text') ?? '';
    return { prompt: i, input: v('input_text') || '', ours, upstream: up, same: texts || ids ? ours === up : null };
  });
}
