#include "controller/report.h"

#include <algorithm>
#include <string_view>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "common/phases.h"
#include "common/cell_spec.h"
#include "controller/readiness.h"

namespace gatehouse::controller {
namespace {

using nlohmann::json;

constexpr size_t kMaxFiguresShown = 6;

// Text safe inside a Markdown table cell.
std::string Cell(std::string s) {
  std::string out;
  for (char c : s) {
    if (c == '|') {
      out += "\\|";
    } else if (c == '\n' || c == '\r') {
      out += ' ';
    } else {
      out += c;
    }
  }
  return out.empty() ? "-" : out;
}

std::string FigureText(const FigureRecord& f) {
  json v = json::parse(f.value_json, nullptr, false);
  std::string value = v.is_string() ? v.get<std::string>() : f.value_json;
  if (value.size() > 40) value = value.substr(0, 40) + "...";
  std::string unit = (f.unit.empty() || f.unit == "text") ? "" : " " + f.unit;
  return f.name + "=" + value + unit;
}

/// The decode phase's text figures (input_text_prompt_{i}, generated_text_prompt_{i},
/// reference_text_prompt_{i}; worker_lib gates_compute.cc) in full, one JSON-quoted line each,
/// in a fenced block; empty when the phase showed no generated text.
std::vector<std::string> DecodedTextLines(const std::vector<PhaseRecord>& phases) {
  auto decode = std::find_if(phases.begin(), phases.end(),
                             [](const PhaseRecord& p) { return p.phase == "decode"; });
  if (decode == phases.end()) return {};
  const std::pair<const char*, const char*> kinds[] = {{"input_text_prompt_", "input"},
                                                       {"generated_text_prompt_", "ours"},
                                                       {"reference_text_prompt_", "upstream"}};
  std::vector<std::string> lines;
  bool any_generated = false;
  for (int i = 0;; ++i) {
    bool found = false;
    for (const auto& [prefix, label] : kinds) {
      const std::string name = prefix + std::to_string(i);
      auto f = std::find_if(decode->figures.begin(), decode->figures.end(),
                            [&](const FigureRecord& r) { return r.name == name; });
      if (f == decode->figures.end()) continue;
      found = true;
      any_generated |= std::string_view(prefix) == "generated_text_prompt_";
      json v = json::parse(f->value_json, nullptr, false);
      lines.push_back(fmt::format("prompt {} {:<9} {}", i, std::string(label) + ":",
                                  (v.is_string() ? v : json(f->value_json)).dump()));
    }
    if (!found) break;
  }
  if (!any_generated) return {};
  return lines;
}

std::string Short(const std::string& id) { return id.substr(0, 12); }

/// "passed (attempt 2)", or why a cell it waits for cannot be read.
std::string PrerequisiteText(const PrerequisiteStatus& p) {
  if (!p.found) return fmt::format("{} `{}`: not stored", p.role, Short(p.cell_id));
  std::string text = fmt::format("{} `{}`: **{}**", p.role, Short(p.cell_id),
                                 AttemptStateName(p.status));
  if (p.status != AttemptState::kPassed && !p.reason.empty()) text += " (" + p.reason + ")";
  return text;
}

/// The fields a team hands in as evidence of an adaptation (model, source, adapter, claimed
/// scope, the control and its result, this variant's result, extensions run or excluded,
/// execution and readiness, unknowns and blockers, validator and date), one table row each,
/// every phase that did not run or did not pass named.
std::vector<std::string> EvidenceSummaryLines(const CellDetail& d, const CellSpec& c) {
  std::vector<std::string> out;
  auto row = [&out](std::string_view field, const std::string& value) {
    out.push_back(fmt::format("| {} | {} |", field, Cell(value)));
  };
  out.push_back("## Evidence summary");
  out.push_back("");
  out.push_back("| field | value |");
  out.push_back("|---|---|");
  row("model", fmt::format("family `{}`; checkpoint {} (`{}`)", c.model_family, c.checkpoint.path,
                           c.checkpoint.digest));
  row("source", fmt::format("adapter repository {} at commit `{}` (branch {})", c.repository,
                            c.commit, d.cell.branch.empty() ? "-" : d.cell.branch));
  row("adapter", "the model family built from that commit by its gatehouse.recipe.json (a C++ "
                 "plugin, or a Python package for lane python), run by the pinned worker (torch " +
                     c.runtime.torch + ")");
  std::string scope = fmt::format("device {}, precision {}, {}, mode {}", c.runtime.device,
                                  c.precision, TopologyText(c.topology), c.mode);
  if (!c.runtime.gpu_model.empty()) scope += ", GPU " + c.runtime.gpu_model;
  if (!c.runtime.cuda.empty()) scope += ", CUDA " + c.runtime.cuda;
  std::string phases;
  for (const std::string& p : c.phases) phases += (phases.empty() ? "" : ", ") + p;
  row("claimed scope", scope + "; phases " + phases);
  std::string control;
  if (c.reference.cell.empty()) {
    control = "reference bundle " + c.reference.path + " (`" + c.reference.digest +
              "`), made outside Gatehouse";
  }
  for (const PrerequisiteStatus& p : d.prerequisites) {
    control += (control.empty() ? "" : "; ") + PrerequisiteText(p);
  }
  row("control", control);
  int passed = 0, ran = 0;
  for (const PhaseRecord& p : d.phases) {
    if (p.status == "RUNNING" || p.status == "SKIPPED") continue;
    ++ran;
    passed += p.status == "PASS";
  }
  row("variant (this cell)",
      fmt::format("**{}**: {} of {} phases that ran passed", AttemptStateName(d.status), passed, ran));
  // The numeric gates' claims (worker_lib bars.h ClaimOf): PASS means correct, inside the
  // envelope of correct implementations; bit-exact (equal to upstream) is a claim of its own.
  std::string claims;
  for (const PhaseRecord& p : d.phases) {
    auto claim = std::find_if(p.figures.begin(), p.figures.end(),
                              [](const FigureRecord& f) { return f.name == "claim"; });
    if (claim == p.figures.end()) continue;
    json v = json::parse(claim->value_json, nullptr, false);
    claims += fmt::format("{}{}: {}", claims.empty() ? "" : "; ", p.phase,
                          v.is_string() ? v.get<std::string>() : claim->value_json);
  }
  if (!claims.empty()) row("numerics", claims);
  std::string extensions;
  for (std::string_view name : kPhases) {
    if (std::find(c.phases.begin(), c.phases.end(), name) == c.phases.end()) {
      extensions += fmt::format("{}{}: excluded (not requested)", extensions.empty() ? "" : "; ", name);
    }
  }
  for (const PhaseRecord& p : d.phases) {
    // A phase not requested is listed above as excluded; its SKIPPED record says no more.
    if (p.status != "SKIPPED" ||
        std::find(c.phases.begin(), c.phases.end(), p.phase) == c.phases.end()) {
      continue;
    }
    extensions += fmt::format("{}{}: SKIPPED ({})", extensions.empty() ? "" : "; ", p.phase,
                              p.reason.empty() ? "no reason given" : p.reason);
  }
  row("extensions", extensions.empty() ? "every phase requested and run" : extensions);
  const std::string lane = c.runtime.device == "cuda" ? "GPU" : "CPU";
  std::string execution = "not run";
  if (d.status == AttemptState::kPassed) execution = "passed";
  if (d.status == AttemptState::kFailed) execution = "failed";
  if (d.status == AttemptState::kBlocked || d.status == AttemptState::kError ||
      d.status == AttemptState::kLost || d.status == AttemptState::kTimedOut ||
      d.status == AttemptState::kCancelled) {
    execution = std::string(AttemptStateName(d.status));
  }
  const std::string other = lane == "GPU" ? "CPU" : "GPU";
  row("execution", fmt::format("{}: {}; {}: not run in this cell", lane, execution, other));
  row("readiness", fmt::format("{}: {}; {}: unverified by this cell (GET /api/v1/readiness "
                               "lists every combination)",
                               lane, ReadinessOf(d.status), other));
  std::string blockers;
  for (const PhaseRecord& p : d.phases) {
    if (p.status != "BLOCKED" && p.status != "UNKNOWN" && p.status != "FAIL") continue;
    blockers += fmt::format("{}{} {}: {}", blockers.empty() ? "" : "; ", p.phase, p.status,
                            p.reason.empty() ? "no reason given" : p.reason);
  }
  for (const std::string& name : c.phases) {
    const bool reported = std::any_of(d.phases.begin(), d.phases.end(),
                                      [&](const PhaseRecord& p) { return p.phase == name; });
    if (!reported && IsTerminal(d.status)) {
      blockers += fmt::format("{}{}: not run", blockers.empty() ? "" : "; ", name);
    }
  }
  if (!d.attempts.empty() && d.status != AttemptState::kPassed && !d.attempts.back().reason.empty()) {
    blockers += (blockers.empty() ? "" : "; ") + d.attempts.back().reason;
  }
  row("unknowns and blockers", blockers.empty() ? "none" : blockers);
  const AttemptRecord* last = d.attempts.empty() ? nullptr : &d.attempts.back();
  row("validator and date",
      last == nullptr || last->agent_id.empty()
          ? "not run yet"
          : fmt::format("Gatehouse agent `{}` (attempt {}), ended {}; submitted by {}",
                        last->agent_id, last->number,
                        last->ended_at.empty() ? "(still running)" : last->ended_at,
                        d.cell.submitter.empty() ? "-" : d.cell.submitter));
  out.push_back("");
  return out;
}

/// The control's phases beside this cell's (status and first figures), for a cell whose
/// control (a cell named by `control`) has phases; empty otherwise.
std::vector<std::string> ControlComparisonLines(const CellDetail& d) {
  auto control = std::find_if(d.prerequisites.begin(), d.prerequisites.end(),
                              [](const PrerequisiteStatus& p) { return p.role == "control"; });
  if (control == d.prerequisites.end() || control->phases.empty()) return {};
  auto figures = [](const PhaseRecord& p) {
    std::string text;
    for (size_t i = 0; i < p.figures.size() && i < 2; ++i) {
      text += (i ? ", " : "") + FigureText(p.figures[i]);
    }
    return text;
  };
  std::vector<std::string> out = {
      fmt::format("## Control `{}` and this variant", Short(control->cell_id)), "",
      "| phase | control | this cell |", "|---|---|---|"};
  for (std::string_view name : kPhases) {
    auto find = [&](const std::vector<PhaseRecord>& v) {
      return std::find_if(v.begin(), v.end(), [&](const PhaseRecord& p) { return p.phase == name; });
    };
    auto theirs = find(control->phases);
    auto ours = find(d.phases);
    if (theirs == control->phases.end() && ours == d.phases.end()) continue;
    auto text = [&](auto it, const std::vector<PhaseRecord>& v) {
      if (it == v.end()) return std::string("not run");
      const std::string f = figures(*it);
      return it->status + (f.empty() ? "" : " (" + f + ")");
    };
    out.push_back(fmt::format("| {} | {} | {} |", name, Cell(text(theirs, control->phases)),
                              Cell(text(ours, d.phases))));
  }
  out.push_back("");
  return out;
}

}  // namespace

std::string RenderReport(const CellDetail& d) {
  const Result<CellSpec> spec = ParseCellSpecJson(d.cell.spec_json);
  std::string out;
  auto line = [&out](std::string_view s) {
    out += s;
    out += '\n';
  };

  line(fmt::format("# Gatehouse evidence report: cell {}", d.cell.id.substr(0, 12)));
  line("");
  line("| | |");
  line("|---|---|");
  line(fmt::format("| cell | `{}` |", d.cell.id));
  line(fmt::format("| status | **{}** |", AttemptStateName(d.status)));
  const bool reference = spec.ok() && spec->IsReference();
  if (reference) {
    line("| kind | reference cell: upstream (transformers) on the checkpoint makes the bundle "
         "validation cells compare with |");
  } else {
    line(fmt::format("| repository | {} |", Cell(d.cell.repository)));
    line(fmt::format("| commit | `{}` |", d.cell.commit_sha));
    line(fmt::format("| branch | {} |", Cell(d.cell.branch)));
    line(fmt::format("| model family | {} |", Cell(d.cell.model_family)));
  }
  if (spec.ok() && reference) {
    const CellSpec& c = *spec;
    line(fmt::format("| checkpoint | {} (`{}`) |", Cell(c.checkpoint.path), c.checkpoint.digest));
    line(fmt::format("| runtime pin | torch {}, transformers {}, device {} |",
                     Cell(c.runtime.torch), Cell(c.runtime.transformers), Cell(c.runtime.device)));
    line(fmt::format("| prompts | {} |",
                     c.prompts.empty() ? std::string("chosen from config.json (see reference.json "
                                                     "prompts_chosen)")
                                       : std::to_string(c.prompts.size()) + " given"));
    line(fmt::format("| decode | {} new tokens, greedy |", c.decode.max_new_tokens));
    line(fmt::format("| training | steps={} lr={} seed={} |", c.training.steps,
                     json(c.training.lr).dump(), c.training.seed));
  } else if (spec.ok()) {
    const CellSpec& c = *spec;
    line(fmt::format("| checkpoint | {} (`{}`) |", Cell(c.checkpoint.path), c.checkpoint.digest));
    if (c.reference.cell.empty()) {
      line(fmt::format("| reference | {} (`{}`) |", Cell(c.reference.path), c.reference.digest));
    } else {
      line(fmt::format("| reference | the bundle of reference cell `{}` |", c.reference.cell));
    }
    if (!c.control.empty()) line(fmt::format("| control | cell `{}` |", c.control));
    line(fmt::format("| runtime pin | torch {}, device {} |", Cell(c.runtime.torch),
                     Cell(c.runtime.device)));
    line(fmt::format("| topology | {} |", TopologyText(c.topology)));
    line(fmt::format("| precision | {} |", Cell(c.precision)));
    line(fmt::format("| mode | {} |", Cell(c.mode)));
    line(fmt::format("| training | steps={} lr={} seed={} |", c.training.steps,
                     json(c.training.lr).dump(), c.training.seed));
  } else {
    line(fmt::format("| spec | unreadable: {} |", Cell(spec.status().message())));
  }
  line(fmt::format("| submitted | {} by {} |", d.cell.created_at, Cell(d.cell.submitter)));
  line("");
  if (spec.ok() && !reference) {
    for (const std::string& l : EvidenceSummaryLines(d, *spec)) line(l);
    for (const std::string& l : ControlComparisonLines(d)) line(l);
  }

  const AttemptRecord* latest = d.attempts.empty() ? nullptr : &d.attempts.back();
  line(latest ? fmt::format("## Phases (attempt {})", latest->number) : "## Phases");
  line("");
  line("| phase | status | key figures | reason |");
  line("|---|---|---|---|");
  const std::vector<std::string> requested = spec.ok() ? spec->phases : std::vector<std::string>{};
  // Reported phases and requested-but-unreported ones, together in phase order.
  auto phase_row = [&](const PhaseRecord& p) {
    std::string figures;
    for (size_t i = 0; i < p.figures.size() && i < kMaxFiguresShown; ++i) {
      figures += (i ? ", " : "") + FigureText(p.figures[i]);
    }
    if (p.figures.size() > kMaxFiguresShown) {
      figures += fmt::format(" (+{} more)", p.figures.size() - kMaxFiguresShown);
    }
    line(fmt::format("| {} | {} | {} | {} |", p.phase, p.status, Cell(figures), Cell(p.reason)));
  };
  std::vector<std::string_view> order(kPhases.begin(), kPhases.end());
  if (reference) order.assign(kReferenceCellPhases.begin(), kReferenceCellPhases.end());
  for (std::string_view name : order) {
    auto reported = std::find_if(d.phases.begin(), d.phases.end(),
                                 [&](const PhaseRecord& p) { return p.phase == name; });
    if (reported != d.phases.end()) {
      phase_row(*reported);
    } else if (std::find(requested.begin(), requested.end(), name) != requested.end()) {
      line(fmt::format("| {} | (not reported) | - | - |", name));
    }
  }
  for (const PhaseRecord& p : d.phases) {  // names outside those, if an agent sent any
    if (std::find(order.begin(), order.end(), p.phase) == order.end()) phase_row(p);
  }
  line("");

  if (!d.artifacts.empty()) {
    line("## Artifacts");
    line("");
    line("| attempt | name | digest | bytes | stored |");
    line("|---|---|---|---|---|");
    for (const ArtifactRecord& a : d.artifacts) {
      const auto attempt = std::find_if(d.attempts.begin(), d.attempts.end(),
                                        [&](const AttemptRecord& r) { return r.id == a.attempt_id; });
      line(fmt::format("| {} | {} | `{}` | {} | {} |",
                       attempt == d.attempts.end() ? 0 : attempt->number, Cell(a.name), a.digest,
                       a.size,
                       a.expired_at.empty() ? std::string("yes")
                                            : "removed by artifact retention at " + a.expired_at));
    }
    line("");
  }

  if (auto text = DecodedTextLines(d.phases); !text.empty()) {
    line("## Decoded text (decode phase)");
    line("");
    line("Greedy continuations as text, through the checkpoint's tokenizer.json; \"upstream\" is "
         "transformers' decode of its own greedy ids. The verdict is on the ids.");
    line("");
    line("```text");
    for (const std::string& l : text) line(l);
    line("```");
    line("");
  }

  line("## Attempts");
  line("");
  line("| # | state | agent | created | started | ended | reason |");
  line("|---|---|---|---|---|---|---|");
  for (const AttemptRecord& a : d.attempts) {
    line(fmt::format("| {} | {} | {} | {} | {} | {} | {} |", a.number, AttemptStateName(a.state),
                     Cell(a.agent_id), Cell(a.created_at), Cell(a.started_at), Cell(a.ended_at),
                     Cell(a.reason)));
  }
  line("");

  line("## Reasons for non-PASS phases");
  line("");
  bool any = false;
  // A phase still RUNNING when its attempt has ended (cancelled, timed out, lost, an error)
  // never finished: it is a reason too, with the attempt's.
  const bool ended = IsTerminal(d.status);
  const std::string attempt_reason = d.attempts.empty() ? "" : d.attempts.back().reason;
  for (const PhaseRecord& p : d.phases) {
    if (p.status == "RUNNING" && ended) {
      any = true;
      line(fmt::format("- **{}** did not finish: the attempt ended {}{}", p.phase,
                       AttemptStateName(d.status),
                       attempt_reason.empty() ? "" : ": " + attempt_reason));
      continue;
    }
    if (p.status == "PASS" || p.status == "RUNNING") continue;
    any = true;
    std::string cls = p.classification.empty() ? "" : " (" + p.classification + ")";
    line(fmt::format("- **{}** {}{}: {}", p.phase, p.status, cls,
                     p.reason.empty() ? "(no reason given)" : p.reason));
  }
  if (!any) line("None.");
  line("");

  line("## Reproduce");
  line("");
  if (!spec.ok()) {
    line("The stored spec does not parse, so no body reproduces it.");
    return out;
  }
  line("Submit this body to `POST /api/v1/cells`; the same inputs give the same cell id.");
  line("");
  line("```json");
  line(ReproduceBody(*spec).dump(2));
  line("```");
  return out;
}

}  // namespace gatehouse::controller
