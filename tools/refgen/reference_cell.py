#!/usr/bin/env python3
"""Upstream's reference bundle for any Hugging Face checkpoint directory: the reference cell.

What
    Runs upstream (transformers) on a user's checkpoint directory (config.json + safetensors,
    maybe a tokenizer) and writes the reference bundle the numerical gates compare with (format
    gatehouse-reference/2, docs/protocols.md §6), through the same code path as the fixture
    generator: make_checkpoint.make_reference (fp32 and bf16 forwards, plain-greedy decode,
    decode and continuation logits, the decode floor and the training trace).

    The fp32 model is AutoModelForCausalLM.from_pretrained(DIR, dtype=float32,
    attn_implementation="eager") on the cell's device; make_reference loads the bf16 copy itself
    (the training trace runs on the CPU). Nothing is downloaded (HF_HUB_OFFLINE=1) and no remote
    code runs (trust_remote_code stays off). The greedy continuations are not checked for
    degeneracy (min_distinct=None: a user's model may repeat a token); their distinct-token counts
    are in reference.json "continuation_distinct_tokens" and in the figures.

Inputs
    Run-spec mode (the agent's reference cell):
      reference_cell.py --run-spec RUN_JSON --out DIR
    RUN_JSON is the frozen cell spec plus `attempt` (docs/protocols.md §2, §3). Members read:
      checkpoint.path, checkpoint.digest   the checkpoint and its frozen DirectoryDigest
      runtime.torch                        pin: torch.__version__ without its "+local" suffix
      runtime.transformers                 pin (absent or "": not pinned): transformers.__version__
      runtime.device                       "cpu" | "cuda" (cuda:LOCAL_RANK)
      decode.max_new_tokens                the greedy decode length N
      training.steps, .lr, .seed           the training trace's AdamW steps, lr and seed
      prompts                              optional list; each {"ids": [int, ...]} (used as given)
                                           or {"text": "...", "chat": bool} (tokenized with the
                                           checkpoint's tokenizer; chat: its chat template, a
                                           user turn plus the generation prompt). Empty/absent:
                                           the default prompts below.
      phases                               optional; "identity" / "reference" not listed: SKIPPED
      attempt.dir                          optional; artifact paths are relative to it when DIR
                                           is under it, else absolute
    Person / test mode (no pins checked; the digest is computed and recorded):
      reference_cell.py --checkpoint DIR --out DIR [--prompts FILE] [--max-new-tokens N]
                        [--device cpu|cuda] [--train-steps S] [--train-lr LR] [--train-seed SEED]
    FILE is a JSON list of prompts as above. Defaults: make_checkpoint's MAX_NEW_TOKENS (32) and
    TRAIN_STEPS / TRAIN_LR / TRAIN_SEED (4, 1e-3, 1234).

    Default prompts (chosen from the config transformers reads from config.json; RoPE scaling
    and sliding-window bugs do not show at short positions), in this order:
      a. short: "The capital of France is" tokenized (with the tokenizer's special tokens) when
         the checkpoint has a tokenizer, else SHORT_PROMPT_TOKENS seeded random ids;
      b. chat: CHAT_PROMPT_TEXT through the tokenizer's chat template, when it has one;
      c. medium: MEDIUM_PROMPT_TOKENS seeded random ids;
      d. rope_scaling / rope_parameters naming original_max_position_embeddings O: one prompt of
         O + LONG_PROMPT_MARGIN seeded random ids;
      e. a non-null sliding_window W that is in use (not use_sliding_window: false; with
         layer_types, some layer "sliding_attention"): one prompt of W + LONG_PROMPT_MARGIN
         seeded random ids (merged with d when the lengths are equal);
      f. far: FAR_PROMPT_TOKENS (300) seeded random ids, cut to the cap, unless d or e already
         reaches that far: RoPE bugs barely move logits near position 0, in every model.
    Random ids are drawn in [3, vocab_size) (the ids of the usual pad/bos/eos left out; with a
    tokenizer smaller than the vocabulary, in [3, len(tokenizer))) from a torch.Generator seeded
    with make_checkpoint.SEED (reference.json "seed"), in the order above.
    Random ids, not repeated text: they need no tokenizer, cover the vocabulary, and do not invite
    the copying a periodic input does. Every default prompt is capped at
    min(MAX_DEFAULT_PROMPT_TOKENS, max_position_embeddings - max_new_tokens): a and c are cut to
    the cap (the "why" says so), and so is f; d and e, whose point is to pass a threshold, are left out when
    the cap is below their length and recorded in "prompts_omitted" (what was not probed).

Outputs
    DIR/reference.json and DIR/reference.safetensors (docs/protocols.md §6), written into a
    temporary folder beside DIR and renamed into place: never a half-written bundle. An existing
    DIR is replaced only when it is empty or holds nothing but those two files (an older bundle);
    anything else there is a usage error. reference.json keys beyond make_reference's:
      "kind": "reference_cell", "generator": "tools/refgen/reference_cell.py",
      "checkpoint_digest": "sha256:<hex>", "upstream_class": the *ForCausalLM class,
      "tokenizer": bool, "prompts_chosen": [{"index", "length", "why"}] (every prompt),
      "prompts_omitted": [{"why", "needed_length", "cap"}],
      "upstream_unexpected_keys": checkpoint tensors from_pretrained did not use (when any),
      "training_dropout": config fields with a nonzero dropout (when any: the training trace
      then ran with dropout on, which an adapter cannot reproduce).
    "prompts" (the decode gate's prompt text and upstream's decoded fp32 continuation,
    {"text", "greedy_text"} plus "chat": true for chat prompts) is written only when the
    checkpoint has a tokenizer; without one the bundle has no text at all (num_prompts alone).

    Run-spec mode writes worker events (docs/protocols.md §4) as JSON lines on standard output
    and nothing else there (file descriptor 1 is pointed at standard error for everything else):
      identity:  phase_start; figures torch, transformers, checkpoint_digest, torch_pin,
                 transformers_pin, device (unit text); phase_end PASS, or BLOCKED naming expected
                 and actual for a pin, the digest, or device cuda without CUDA.
      reference: phase_start; figures num_prompts, prompt_<i>_length, max_new_tokens,
                 vocab_size, prompts_omitted, prompt_<i>_distinct_tokens (fp32 continuation)
                 (count), model_type (text), duration_ms (ms), peak_rss_bytes (bytes,
                 getrusage ru_maxrss); artifacts reference.json and reference.safetensors
                 (path, bytes, sha256); phase_end.
      run_end:   FAIL if a phase failed, else BLOCKED, else UNKNOWN, else PASS.
    A phase after one that ended FAIL, BLOCKED or UNKNOWN is a lone phase_end SKIPPED. With
    WORLD_SIZE > 1 every event carries "rank", and ranks > 0 report reference SKIPPED.
    Person mode writes the same events to standard error.

Errors
    reference FAIL unknown   "transformers cannot load the checkpoint: <type>: <text>" when
                             AutoConfig or AutoModelForCausalLM.from_pretrained raises (also
                             an unknown model_type, or a model needing remote code); any other
                             exception while making the bundle: "<type>: <text>" (FAIL resource
                             for out-of-memory); upstream's own output non-finite (a NaN or Inf
                             logit, a NaN training loss), which the bundle reader would refuse.
    reference BLOCKED        a text prompt without a usable tokenizer, a chat prompt whose
                             tokenizer has no chat template, a prompt that tokenizes to nothing,
                             an id outside [0, vocab_size) (each naming the prompt and id);
                             weights upstream would leave randomly initialised (missing from the
                             checkpoint); training steps without a prompt of >= 2 tokens;
                             max_position_embeddings leaving no room for a default prompt.
    Exit status: run-spec mode 0 whenever run_end was written (whatever its status); person mode
    0 on PASS, 1 otherwise; 2 for usage errors (a run spec or prompt list that does not read, a
    refused --out) before any event; 1 for a crash before any event.
"""

import argparse
import hashlib
import json
import os
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

# Inputs are the frozen checkpoint only: never fetch anything from the Hub.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import torch  # noqa: E402
import transformers  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import make_checkpoint  # noqa: E402  (make_reference and its constants; sets MKL_CBWR before any math)
from memory import bound_heap  # noqa: E402

MAX_DEFAULT_PROMPT_TOKENS = 4096
SHORT_PROMPT_TEXT = "The capital of France is"
SHORT_PROMPT_TOKENS = 7
CHAT_PROMPT_TEXT = "What is the capital of France? Answer in one sentence."
MEDIUM_PROMPT_TOKENS = 33
LONG_PROMPT_MARGIN = 16
# f. Every model gets one prompt this long: RoPE bugs (a wrong theta, a rotation of the wrong
# halves) barely move logits at short positions (the fixtures' longest prompt is as long).
FAR_PROMPT_TOKENS = 300
PROMPT_SEED = make_checkpoint.SEED
# Files whose presence means the checkpoint ships a tokenizer (AutoTokenizer is tried only then).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json",
                   "spiece.model", "sentencepiece.bpe.model", "vocab.txt")
EXCEPTION_TEXT_LIMIT = 2000


class UsageError(Exception):
    """A run spec, prompt list or argument that does not read: exit 2 before any event."""


def log(msg):
    print(f"reference_cell: {msg}", file=sys.stderr, flush=True)


def exception_text(e, limit=EXCEPTION_TEXT_LIMIT):
    text = f"{type(e).__name__}: {e}"
    return text if len(text) <= limit else text[:limit] + " [...]"


def strip_local_version(version):
    return version.split("+", 1)[0]


# --- DirectoryDigest (common/sha256.h) -----------------------------------------------------

def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def directory_digest(directory):
    """common/sha256.h DirectoryDigest, byte for byte as the C++ computes it: SHA-256 over
    "<relative path>\t<size>\t<sha256 hex>\n" for every regular file below `directory`, in byte
    order of the relative paths; "sha256:<hex>". What std::filesystem makes of links, kept here
    because the frozen digest comes from that code: symlinked directories are not descended
    into; broken links and special files are left out; a symlink to a regular file counts under
    its own name (as in a Hub cache snapshot, whose files link into ../../blobs/) with its
    target's size and contents. Raises OSError / ValueError (not a directory, no file)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise NotADirectoryError(f"'{directory}' is not a directory")

    def fail(err):
        raise err

    base = str(directory)
    files = []
    for root, _dirs, names in os.walk(directory, followlinks=False, onerror=fail):
        for name in names:
            full = os.path.join(root, name)
            if os.path.isfile(full):
                rel = os.path.relpath(full, base)
                files.append(rel.replace(os.sep, "/"))
    if not files:
        raise ValueError(f"directory '{directory}' holds no file")
    files.sort(key=os.fsencode)
    tree = hashlib.sha256()
    for rel in files:
        full = os.path.join(base, rel)
        tree.update(os.fsencode(rel) + b"\t" + str(os.path.getsize(full)).encode() + b"\t" +
                    sha256_file(full).encode() + b"\n")
    return "sha256:" + tree.hexdigest()


# --- events (docs/protocols.md §4) ---------------------------------------------------------

def now_ms():
    return int(time.time() * 1000)


def json_value(v):
    if isinstance(v, float) and (v != v or v in (float("inf"), float("-inf"))):
        return "NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")
    return v


class Events:
    """One JSON object per line on `stream`, each with ts_ms (and rank when WORLD_SIZE > 1)."""

    def __init__(self, stream, rank=None):
        self.stream = stream
        self.rank = rank
        self.written = 0

    def emit(self, event, **fields):
        obj = {"event": event, **fields, "ts_ms": now_ms()}
        if self.rank is not None:
            obj["rank"] = self.rank
        line = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
        self.stream.write(line.encode("utf-8", "replace").decode("utf-8") + "\n")
        self.stream.flush()
        self.written += 1


class Outcome:
    """What one phase found: status, reason, classification (FAIL only), figures, artifacts."""

    def __init__(self):
        self.status, self.reason, self.classification = "PASS", "", ""
        self.figures, self.artifacts = [], []

    def figure(self, name, value, unit):
        self.figures.append((name, value, unit))

    def text(self, name, value):
        self.figure(name, str(value), "text")

    def end(self, status, reason, classification=""):
        self.status, self.reason = status, reason
        self.classification = classification if status == "FAIL" else ""
        return self

    def blocked(self, reason):
        return self.end("BLOCKED", reason)

    def fail(self, reason, classification="unknown"):
        return self.end("FAIL", reason, classification)


def run_phases(job, events, phases):
    """Runs [(name, fn(job) -> Outcome)] as the worker's gate runner does; returns run_end's
    status (also emitted)."""
    seen, stopped_by = set(), ""
    for name, fn in phases:
        if job.phases is not None and name not in job.phases:
            events.emit("phase_end", phase=name, status="SKIPPED", reason="not requested",
                        classification="", duration_ms=0)
            continue
        if job.rank > 0 and name == "reference":
            events.emit("phase_end", phase=name, status="SKIPPED",
                        reason=f"rank {job.rank} of {job.world_size}: phase {name} runs on rank 0 only",
                        classification="", duration_ms=0)
            continue
        if stopped_by:
            events.emit("phase_end", phase=name, status="SKIPPED",
                        reason=f"skipped: earlier phase {stopped_by}", classification="",
                        duration_ms=0)
            continue
        events.emit("phase_start", phase=name)
        log(f"phase {name}: start")
        t0 = now_ms()
        try:
            out = fn(job)
        except Exception as e:  # a crash in a phase is that phase's FAIL, never a lost run_end
            out = Outcome().fail(exception_text(e))
        for fname, value, unit in out.figures:
            events.emit("figure", phase=name, name=fname, value=json_value(value), unit=unit)
        for art in out.artifacts:
            events.emit("artifact", phase=name, **art)
        if out.status != "PASS" and not out.reason:
            out.reason = f"gate ended {out.status} without a reason"
        events.emit("phase_end", phase=name, status=out.status, reason=out.reason,
                    classification=out.classification, duration_ms=now_ms() - t0)
        log(f"phase {name}: {out.status}" + (f": {out.reason}" if out.reason else ""))
        seen.add(out.status)
        if out.status in ("FAIL", "BLOCKED", "UNKNOWN"):
            stopped_by = f"{name} ended {out.status}"
    overall = next((s for s in ("FAIL", "BLOCKED", "UNKNOWN") if s in seen), "PASS")
    events.emit("run_end", status=overall)
    return overall


# --- the job -------------------------------------------------------------------------------

class Job:
    checkpoint: Path
    out: Path
    expected_digest = None   # None: not checked (person mode)
    torch_pin = None         # None: not checked
    transformers_pin = None  # None or "": not checked
    device = "cpu"
    max_new_tokens = make_checkpoint.MAX_NEW_TOKENS
    train_steps = make_checkpoint.TRAIN_STEPS
    train_lr = make_checkpoint.TRAIN_LR
    train_seed = make_checkpoint.TRAIN_SEED
    envelope = True          # measure the envelope of correct implementations (envelope.py)
    prompts = ()             # parsed: [{"ids": [...]}] or [{"text": str, "chat": bool}]
    phases = None            # None: all
    attempt_dir = None
    rank, world_size, local_rank = 0, 1, 0
    digest = None            # computed by identity


def _field(obj, dotted, expect, required=True, default=None):
    """obj's member at `dotted` (a.b.c) checked by expect(value) -> error text or None."""
    cur = obj
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            if required:
                raise UsageError(f"invalid run spec: field '{dotted}' is missing")
            return default
        cur = cur[part]
    err = expect(cur)
    if err:
        raise UsageError(f"invalid run spec: field '{dotted}': expected {err}, got {json.dumps(cur)}")
    return cur


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _string(v):
    return None if isinstance(v, str) else "a string"


def _string_nonempty(v):
    return None if isinstance(v, str) and v else "a non-empty string"


def parse_prompts(raw, where):
    """A prompt list (run spec `prompts` or --prompts FILE) -> [{"ids": [...]} | {"text", "chat"}].
    Accepts the canonical form with every member ({"ids": [], "text": "...", "chat": false})."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise UsageError(f"{where}: expected a list of prompts, got {json.dumps(raw)[:200]}")
    prompts = []
    for i, p in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(p, dict):
            raise UsageError(f"{at}: expected an object, got {json.dumps(p)[:200]}")
        unknown = set(p) - {"ids", "text", "chat"}
        if unknown:
            raise UsageError(f"{at}: unknown member(s) {sorted(unknown)}")
        ids, text, chat = p.get("ids") or [], p.get("text") or "", p.get("chat", False)
        if not isinstance(ids, list) or not all(_is_int(x) for x in ids):
            raise UsageError(f"{at}.ids: expected a list of integers")
        if not isinstance(text, str):
            raise UsageError(f"{at}.text: expected a string")
        if not isinstance(chat, bool):
            raise UsageError(f"{at}.chat: expected a boolean")
        if bool(ids) == bool(text):
            raise UsageError(f"{at}: expected exactly one of a non-empty 'ids' or 'text'")
        if ids and chat:
            raise UsageError(f"{at}: 'chat' applies to text prompts only")
        prompts.append({"ids": list(ids)} if ids else {"text": text, "chat": chat})
    return prompts


def job_from_run_spec(path, out):
    try:
        spec = json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UsageError(f"cannot read run spec {path}: {exception_text(e)}")
    if not isinstance(spec, dict):
        raise UsageError(f"run spec {path}: not a JSON object")
    job = Job()
    job.checkpoint = Path(_field(spec, "checkpoint.path", _string_nonempty))
    job.expected_digest = _field(spec, "checkpoint.digest", _string)
    job.torch_pin = _field(spec, "runtime.torch", _string)
    job.transformers_pin = _field(spec, "runtime.transformers", _string, required=False, default="")
    job.device = _field(spec, "runtime.device",
                        lambda v: None if v in ("cpu", "cuda") else '"cpu" or "cuda"')
    job.max_new_tokens = _field(spec, "decode.max_new_tokens",
                                lambda v: None if _is_int(v) and v >= 1 else "an integer >= 1")
    job.train_steps = _field(spec, "training.steps",
                             lambda v: None if _is_int(v) and v >= 0 else "an integer >= 0")
    job.train_lr = float(_field(spec, "training.lr",
                                lambda v: None if isinstance(v, (int, float)) and not isinstance(v, bool)
                                else "a number"))
    job.train_seed = _field(spec, "training.seed", lambda v: None if _is_int(v) else "an integer")
    job.prompts = parse_prompts(spec.get("prompts"), "invalid run spec: field 'prompts'")
    phases = spec.get("phases")
    if phases is not None:
        if not isinstance(phases, list) or not all(isinstance(p, str) for p in phases):
            raise UsageError("invalid run spec: field 'phases': expected a list of strings")
        job.phases = set(phases)
    attempt_dir = _field(spec, "attempt.dir", _string, required=False)
    job.attempt_dir = Path(attempt_dir) if attempt_dir else None
    job.out = Path(out)
    return job


def check_out_dir(out):
    """An existing --out is replaced only when empty or an older bundle (reference.json and/or
    reference.safetensors, nothing else)."""
    if not os.path.lexists(out):
        return
    if out.is_symlink() or not out.is_dir():
        raise UsageError(f"--out {out} exists and is not a directory")
    entries = list(out.iterdir())
    allowed = {"reference.json", "reference.safetensors"}
    if any(e.name not in allowed or not e.is_file() or e.is_symlink() for e in entries):
        raise UsageError(f"--out {out} exists and is not a reference bundle (it holds "
                         f"{sorted(e.name for e in entries)[:10]}); refusing to replace it")


# --- identity ------------------------------------------------------------------------------

def identity_phase(job):
    out = Outcome()
    torch_version = strip_local_version(torch.__version__)
    out.text("torch", torch_version)
    out.text("transformers", transformers.__version__)
    out.text("torch_pin", job.torch_pin if job.torch_pin is not None else "(not pinned)")
    out.text("transformers_pin", job.transformers_pin or "(not pinned)")
    out.text("device", job.device)
    blocks = []
    if job.torch_pin is not None and job.torch_pin != torch_version:
        blocks.append(f"runtime pin torch {job.torch_pin or '(empty)'} but the reference cell "
                      f"runs torch {torch_version} ({torch.__version__})")
    if job.transformers_pin and job.transformers_pin != transformers.__version__:
        blocks.append(f"runtime pin transformers {job.transformers_pin} but the reference cell "
                      f"runs transformers {transformers.__version__}")
    if job.device == "cuda" and not torch.cuda.is_available():
        blocks.append("device cuda requested but torch.cuda.is_available() is false")
    try:
        job.digest = directory_digest(job.checkpoint)
        out.text("checkpoint_digest", job.digest)
        if job.expected_digest is not None and job.digest != job.expected_digest:
            blocks.append(f"checkpoint {job.checkpoint} has digest {job.digest} on this node but "
                          f"the cell is frozen with {job.expected_digest or '(empty)'}")
    except (OSError, ValueError) as e:
        blocks.append(f"checkpoint {job.checkpoint}: {e}")
    if blocks:
        return out.blocked("; ".join(blocks))
    return out


# --- default prompts -----------------------------------------------------------------------

def _positive_int(v):
    return v if _is_int(v) and v > 0 else None


def rope_original_max(text_config, raw):
    """The largest original_max_position_embeddings named by rope_scaling / rope_parameters
    (transformers' parsed form and config.json's, nested per layer type too), or None. A
    top-level original_max_position_embeddings counts when a non-default RoPE type is in use
    (Phi-3 LongRoPE keeps it there)."""
    found, types = [], set()

    def scan(d, depth=0):
        if not isinstance(d, dict) or depth > 2:
            return
        v = _positive_int(d.get("original_max_position_embeddings"))
        if v:
            found.append(v)
        for key in ("rope_type", "type"):
            if isinstance(d.get(key), str):
                types.add(d[key])
        for x in d.values():
            scan(x, depth + 1)

    raw_text = raw.get("text_config") if isinstance(raw.get("text_config"), dict) else {}
    for src in (getattr(text_config, "rope_parameters", None), getattr(text_config, "rope_scaling", None),
                raw.get("rope_scaling"), raw.get("rope_parameters"),
                raw_text.get("rope_scaling"), raw_text.get("rope_parameters")):
        scan(src)
    if not found and types - {"default"}:
        top = _positive_int(getattr(text_config, "original_max_position_embeddings", None))
        if top:
            found.append(top)
    return max(found) if found else None


def sliding_window_in_use(text_config, raw):
    """(window, why) when a sliding window is in use, else (None, why-not)."""
    window = _positive_int(getattr(text_config, "sliding_window", None))
    if window is None:
        return None, "no sliding_window"
    layer_types = getattr(text_config, "layer_types", None)
    if layer_types:
        n = sum(1 for t in layer_types if t == "sliding_attention")
        if n == 0:
            return None, f"sliding_window {window} but no layer is sliding_attention"
        return window, f"sliding_window {window} on {n} of {len(layer_types)} layers (layer_types)"
    use = getattr(text_config, "use_sliding_window", raw.get("use_sliding_window"))
    if use is False:
        return None, f"sliding_window {window} but use_sliding_window false"
    return window, f"sliding_window {window}" + (" with use_sliding_window true" if use else "")


def default_prompts(text_config, raw, tokenizer, vocab, max_new_tokens):
    """[(ids [T], kind, why, text or None)], omitted [{"why", "needed_length", "cap"}], or raises
    _Blocked when no prompt fits."""
    max_pos = _positive_int(getattr(text_config, "max_position_embeddings", None))
    cap = MAX_DEFAULT_PROMPT_TOKENS
    cap_why = f"MAX_DEFAULT_PROMPT_TOKENS {MAX_DEFAULT_PROMPT_TOKENS}"
    if max_pos is not None and max_pos - max_new_tokens < cap:
        cap = max_pos - max_new_tokens
        cap_why = f"max_position_embeddings {max_pos} - max_new_tokens {max_new_tokens}"
    if cap < 1:
        raise _Blocked(f"max_position_embeddings {max_pos} leaves no room for a default prompt "
                       f"before max_new_tokens {max_new_tokens}")
    gen = torch.Generator().manual_seed(PROMPT_SEED)
    # With a tokenizer, ids it knows (a padded embedding is often larger than the tokenizer, and
    # its extra rows are never trained nor decodable).
    high = vocab
    if tokenizer is not None and 3 < len(tokenizer) < vocab:
        high = len(tokenizer)
    low = 3 if high > 3 else 0

    def random_ids(n):
        return torch.randint(low, high, (n,), generator=gen, dtype=torch.int64)

    prompts, omitted = [], []
    # a. short
    if tokenizer is not None:
        ids = tokenize_text(tokenizer, SHORT_PROMPT_TEXT, chat=False)
        why = f"short prompt: {SHORT_PROMPT_TEXT!r} tokenized by the checkpoint's tokenizer"
        if len(ids) > cap:
            ids, why = ids[:cap], why + f", cut to {cap} tokens ({cap_why})"
        prompts.append((torch.tensor(ids, dtype=torch.int64), "short", why, SHORT_PROMPT_TEXT, False))
    else:
        n = min(SHORT_PROMPT_TOKENS, cap)
        why = f"short prompt: {n} seeded random ids (the checkpoint has no tokenizer)"
        prompts.append((random_ids(n), "short", why, None, False))
    # b. chat
    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        try:
            ids = tokenize_text(tokenizer, CHAT_PROMPT_TEXT, chat=True)
        except Exception as e:  # a template that needs more than one user turn, say
            ids = None
            omitted.append({"why": "chat prompt: the tokenizer's chat template raised "
                                   f"{exception_text(e, 300)}", "needed_length": None, "cap": cap})
        if ids is None:
            pass
        elif len(ids) <= cap:
            prompts.append((torch.tensor(ids, dtype=torch.int64), "chat",
                            f"chat prompt: {CHAT_PROMPT_TEXT!r} as a user turn through the "
                            "tokenizer's chat template (with the generation prompt)",
                            CHAT_PROMPT_TEXT, True))
        else:
            omitted.append({"why": "chat prompt longer than the cap", "needed_length": len(ids),
                            "cap": cap})
    # c. medium
    n = min(MEDIUM_PROMPT_TOKENS, cap)
    why = f"medium prompt: {n} seeded random ids"
    if n < MEDIUM_PROMPT_TOKENS:
        why += f", cut from {MEDIUM_PROMPT_TOKENS} ({cap_why})"
    prompts.append((random_ids(n), "medium", why, None, False))
    # d., e. past the thresholds where long-context bugs start to show
    long_ones = {}
    original = rope_original_max(text_config, raw)
    if original is not None:
        long_ones.setdefault(original + LONG_PROMPT_MARGIN, []).append(
            f"RoPE scaling names original_max_position_embeddings {original}: "
            f"{original} + {LONG_PROMPT_MARGIN} tokens pass it")
    window, window_why = sliding_window_in_use(text_config, raw)
    if window is not None:
        long_ones.setdefault(window + LONG_PROMPT_MARGIN, []).append(
            f"{window_why}: {window} + {LONG_PROMPT_MARGIN} tokens pass it")
    longest = MEDIUM_PROMPT_TOKENS
    for length, whys in sorted(long_ones.items()):
        if length > cap:
            for w in whys:
                omitted.append({"why": f"{w}, but the cap is {cap} ({cap_why}): not probed",
                                "needed_length": length, "cap": cap})
            continue
        prompts.append((random_ids(length), "long",
                        "long prompt: " + "; ".join(whys) + f" ({length} seeded random ids)",
                        None, False))
        longest = max(longest, length)
    # f. far: positions far from 0 in every model, cut to the cap like a and c (its point is
    #    distance, not a threshold), unless a prompt above already reaches that far.
    far = min(FAR_PROMPT_TOKENS, cap)
    if longest < far:
        why = f"far prompt: {far} seeded random ids, positions far from 0 where RoPE bugs show"
        if far < FAR_PROMPT_TOKENS:
            why += f", cut from {FAR_PROMPT_TOKENS} ({cap_why})"
        prompts.append((random_ids(far), "long", why, None, False))
    return prompts, omitted


class _Blocked(Exception):
    pass


def tokenize_text(tokenizer, text, chat):
    if chat:
        out = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                            add_generation_prompt=True, tokenize=True)
        if hasattr(out, "keys") and "input_ids" in out:  # transformers 5: a BatchEncoding
            out = out["input_ids"]
    else:
        out = tokenizer(text)["input_ids"]
    if hasattr(out, "tolist"):
        out = out.tolist()
    if out and isinstance(out[0], (list, tuple)):
        out = out[0]
    return [int(x) for x in out]


def load_tokenizer(checkpoint):
    """(tokenizer or None, why there is none)."""
    present = [f for f in TOKENIZER_FILES if (checkpoint / f).is_file()]
    if not present:
        return None, f"no tokenizer files ({', '.join(TOKENIZER_FILES)}) in {checkpoint}"
    try:
        return transformers.AutoTokenizer.from_pretrained(str(checkpoint)), ""
    except Exception as e:
        return None, f"AutoTokenizer.from_pretrained failed: {exception_text(e, 500)}"


def dropout_fields(config):
    """Config fields naming a dropout probability that is nonzero (the training trace runs in
    train mode, so these make it random)."""
    found = {}
    for key, value in config.to_dict().items():
        if ("dropout" in key or "pdrop" in key) and isinstance(value, (int, float)) \
                and not isinstance(value, bool) and value > 0:
            found[key] = value
    return found


# --- reference -----------------------------------------------------------------------------

def reference_phase(job):
    out = Outcome()
    t0 = time.monotonic()
    try:
        _make_bundle(job, out)
    finally:
        out.figure("duration_ms", int((time.monotonic() - t0) * 1000), "ms")
        # ru_maxrss is KiB on Linux.
        out.figure("peak_rss_bytes", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "bytes")
    return out


def _make_bundle(job, out):
    ckpt = job.checkpoint
    cannot_load = "transformers cannot load the checkpoint: "
    try:
        config = transformers.AutoConfig.from_pretrained(str(ckpt))
    except Exception as e:
        return out.fail(cannot_load + exception_text(e))
    text_config = config.get_text_config()
    try:
        raw = json.loads((ckpt / "config.json").read_text())
    except (OSError, ValueError):
        raw = {}
    raw = raw if isinstance(raw, dict) else {}
    vocab = _positive_int(getattr(text_config, "vocab_size", None))
    if vocab is None:
        return out.fail(cannot_load + f"the config has no vocab_size ({type(config).__name__})")
    out.text("model_type", getattr(config, "model_type", ""))
    out.figure("vocab_size", vocab, "count")
    out.figure("max_new_tokens", job.max_new_tokens, "count")

    # The prompts: checked before any weight is loaded.
    tokenizer, no_tokenizer = load_tokenizer(ckpt)
    if tokenizer is None:
        log(f"no tokenizer: {no_tokenizer}")
    prompts = []  # (ids, why, text, chat)
    omitted = []
    if job.prompts:
        for i, p in enumerate(job.prompts):
            if "ids" in p:
                prompts.append((torch.tensor(p["ids"], dtype=torch.int64),
                                "given by the cell (token ids)", None, False))
                continue
            if tokenizer is None:
                return out.blocked(f"prompt {i} is text but the checkpoint has no usable "
                                   f"tokenizer: {no_tokenizer}")
            if p["chat"] and not getattr(tokenizer, "chat_template", None):
                return out.blocked(f"prompt {i} asks for the chat template but the checkpoint's "
                                   f"tokenizer ({type(tokenizer).__name__}) has no chat_template")
            try:
                ids = tokenize_text(tokenizer, p["text"], p["chat"])
            except Exception as e:
                return out.blocked(f"prompt {i}: the checkpoint's tokenizer cannot tokenize it: "
                                   f"{exception_text(e, 500)}")
            if not ids:
                return out.blocked(f"prompt {i} tokenizes to no ids")
            how = "chat template" if p["chat"] else "tokenizer"
            prompts.append((torch.tensor(ids, dtype=torch.int64),
                            f"given by the cell (text, through the checkpoint's {how})",
                            p["text"], p["chat"]))
    else:
        try:
            chosen, omitted = default_prompts(text_config, raw, tokenizer, vocab, job.max_new_tokens)
        except _Blocked as e:
            return out.blocked(str(e))
        prompts = [(ids, why, text, chat) for ids, _kind, why, text, chat in chosen]
    for i, (ids, *_rest) in enumerate(prompts):
        bad = [int(x) for x in ids.tolist() if not 0 <= x < vocab]
        if bad:
            where = "" if job.prompts else " (default prompt from the checkpoint's tokenizer)"
            return out.blocked(f"prompt {i}{where}: token id(s) {sorted(set(bad))[:8]} outside the "
                               f"vocabulary [0, {vocab})")
    out.figure("num_prompts", len(prompts), "count")
    for i, (ids, *_rest) in enumerate(prompts):
        out.figure(f"prompt_{i}_length", ids.numel(), "count")
    out.figure("prompts_omitted", len(omitted), "count")
    if job.train_steps > 0 and not any(ids.numel() >= 2 for ids, *_ in prompts):
        return out.blocked(f"training.steps {job.train_steps} needs a prompt of at least 2 tokens "
                           f"(inputs ids[:-1], labels ids[1:]); prompt lengths "
                           f"{[ids.numel() for ids, *_ in prompts]}")

    # Upstream, as a user loads it.
    device = torch.device("cuda", job.local_rank) if job.device == "cuda" else torch.device("cpu")
    torch.manual_seed(make_checkpoint.SEED)
    try:
        model, info = transformers.AutoModelForCausalLM.from_pretrained(
            str(ckpt), dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    except Exception as e:
        return out.fail(cannot_load + exception_text(e))
    missing = sorted(info.get("missing_keys") or [])
    mismatched = sorted(str(k) for k in (info.get("mismatched_keys") or []))
    if missing or mismatched:
        parts = []
        if missing:
            parts.append(f"{len(missing)} weight(s) missing from the checkpoint: {missing[:8]}")
        if mismatched:
            parts.append(f"{len(mismatched)} weight(s) of another shape: {mismatched[:8]}")
        return out.blocked(f"upstream ({type(model).__name__}.from_pretrained) would initialise "
                           "weights at random, so its logits are no reference: " + "; ".join(parts))
    model = model.to(device).eval()

    if job.digest is None:  # identity not requested
        job.digest = directory_digest(ckpt)
    meta_extra = {
        "kind": "reference_cell",
        "generator": "tools/refgen/reference_cell.py",
        "checkpoint_digest": job.digest,
        "upstream_class": type(model).__name__,
        "tokenizer": tokenizer is not None,
        "prompts_chosen": [{"index": i, "length": ids.numel(), "why": why}
                           for i, (ids, why, _t, _c) in enumerate(prompts)],
        "prompts_omitted": omitted,
    }
    unexpected = sorted(info.get("unexpected_keys") or [])
    if unexpected:
        meta_extra["upstream_unexpected_keys"] = unexpected
    dropout = dropout_fields(config)
    if dropout:
        meta_extra["training_dropout"] = dropout
        log(f"nonzero dropout in the config {dropout}: the training trace runs with it")
    describe = None
    if tokenizer is not None:
        def describe(i, new_ids):
            ids, _why, text, chat = prompts[i]
            entry = {"text": tokenizer.decode(ids.tolist()) if text is None or chat else text,
                     "greedy_text": tokenizer.decode(new_ids.tolist())}
            if chat:
                entry["chat"] = True
            return entry

    job.out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{job.out.name}.", suffix=".tmp", dir=job.out.parent))
    try:
        bundle = staging / "bundle"
        try:
            make_checkpoint.make_reference(
                model, ckpt, bundle, [ids for ids, *_ in prompts], describe=describe,
                meta_extra=meta_extra, min_distinct=None, max_new_tokens=job.max_new_tokens,
                train_steps=job.train_steps, train_lr=job.train_lr, train_seed=job.train_seed,
                release_model=True, envelope=job.envelope)
        except (torch.OutOfMemoryError, MemoryError) as e:
            return out.fail(exception_text(e), "resource")
        except Exception as e:
            return out.fail(exception_text(e))
        written = json.loads((bundle / "reference.json").read_text())
        for i, n in enumerate(written.get("continuation_distinct_tokens", {}).get("fp32", [])):
            out.figure(f"prompt_{i}_distinct_tokens", n, "count")
        envelope_figures(out, written.get("envelope"))
        # Where the phase's time and memory went (make_reference's stages, in order).
        for st in written.get("stages", []):
            out.figure(f"stage_{st['stage']}_ms", round(st["seconds"] * 1000), "ms")
            out.figure(f"stage_{st['stage']}_peak_rss_bytes", st["peak_rss_bytes"], "bytes")
        problems = bundle_problems(bundle)
        if problems:
            return out.fail("upstream's own output cannot be a reference (the bundle reader "
                            "would refuse it): " + "; ".join(problems[:8]))
        if os.path.lexists(job.out):
            os.rename(job.out, staging / "old")
        os.rename(bundle, job.out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    for name in ("reference.json", "reference.safetensors"):
        path = job.out / name
        out.artifacts.append({"name": name, "path": artifact_path(path, job.attempt_dir),
                              "bytes": path.stat().st_size, "sha256": sha256_file(path)})
    return out


def envelope_figures(out, envelope):
    """The envelope's cost and widest spreads as figures of the reference phase (or why there is
    none)."""
    if envelope is None:
        out.text("envelope", "not measured (--no-envelope): validation cells against this bundle "
                             "get the site's own bars")
        return
    out.figure("envelope_ms", round(envelope["seconds"] * 1000), "ms")
    out.text("envelope", ", ".join(envelope["variations"]))
    for precision in ("fp32", "bf16"):
        e = envelope.get(precision)
        if not e:
            continue
        out.figure(f"envelope_{precision}_max_abs_diff", e["prompt"]["max_abs_diff"], "logits")
        out.figure(f"envelope_{precision}_grad_norm_rel", e["training"]["grad_norm_rel"], "ratio")
        if not e.get("harness_exact", True):
            out.text(f"envelope_{precision}_harness",
                     "the canonical run here differs from the bundle's (max abs "
                     f"{e['harness']['prompt']['max_abs_diff']:.3g}): variations were measured "
                     "against this run")


def bundle_problems(bundle):
    """What the bundle reader (worker_lib reference.h) would refuse that only upstream's numbers
    can cause: a non-finite logit, or a NaN / Infinity in reference.json (Python writes them as
    bare NaN / Infinity, which is not JSON)."""
    from safetensors.torch import load_file
    problems = []
    for name, t in sorted(load_file(str(bundle / "reference.safetensors")).items()):
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            problems.append(f"{name} holds {int(torch.isnan(t).sum())} NaN and "
                            f"{int(torch.isinf(t).sum())} Inf")
    bad = []

    def refuse(constant):
        bad.append(constant)
        return 0.0

    json.loads((bundle / "reference.json").read_text(), parse_constant=refuse)
    if bad:
        problems.append(f"reference.json holds {len(bad)} non-finite number(s) ({bad[0]}), e.g. "
                        "a training loss")
    return problems


def artifact_path(path, attempt_dir):
    """Relative to the attempt directory when under it, else absolute."""
    path = Path(os.path.abspath(path))
    if attempt_dir is not None:
        base = Path(os.path.abspath(attempt_dir))
        try:
            return path.relative_to(base).as_posix()
        except ValueError:
            pass
    return str(path)


# --- CLI -----------------------------------------------------------------------------------

def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-spec", type=Path, help="run.json (frozen cell spec + attempt)")
    parser.add_argument("--checkpoint", type=Path, help="checkpoint directory (person mode)")
    parser.add_argument("--out", type=Path, help="bundle directory to write")
    parser.add_argument("--print-runtime", action="store_true",
                        help="print {\"torch\", \"transformers\"} as JSON and exit (the agent's probe)")
    parser.add_argument("--prompts", type=Path, help="JSON list of prompts (person mode)")
    parser.add_argument("--max-new-tokens", type=int, default=make_checkpoint.MAX_NEW_TOKENS)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--train-steps", type=int, default=make_checkpoint.TRAIN_STEPS)
    parser.add_argument("--train-lr", type=float, default=make_checkpoint.TRAIN_LR)
    parser.add_argument("--train-seed", type=int, default=make_checkpoint.TRAIN_SEED)
    parser.add_argument("--no-envelope", action="store_true",
                        help="person mode: skip the envelope of correct implementations (faster; "
                             "validation cells then get the site's own bars)")
    args = parser.parse_args(argv)
    bound_heap()  # before the checkpoint is loaded: freed tensors go back to the system (memory.py)
    if args.print_runtime:
        print(json.dumps({"torch": strip_local_version(torch.__version__),
                          "transformers": transformers.__version__}))
        return 0
    if args.out is None:
        parser.error("--out is required")
    if (args.run_spec is None) == (args.checkpoint is None):
        parser.error("give exactly one of --run-spec or --checkpoint")

    try:
        if args.run_spec is not None:
            person_only = [f"--{k.replace('_', '-')}" for k in ("prompts",)
                           if getattr(args, k) is not None]
            if person_only:
                raise UsageError(f"{', '.join(person_only)} is for --checkpoint mode; the run "
                                 "spec gives the prompts")
            job = job_from_run_spec(args.run_spec, args.out)
        else:
            if not args.checkpoint.is_dir():
                raise UsageError(f"--checkpoint {args.checkpoint} is not a directory")
            if args.max_new_tokens < 1 or args.train_steps < 0:
                raise UsageError("--max-new-tokens must be >= 1 and --train-steps >= 0")
            job = Job()
            job.checkpoint, job.out, job.device = args.checkpoint, args.out, args.device
            job.max_new_tokens = args.max_new_tokens
            job.train_steps, job.train_lr, job.train_seed = args.train_steps, args.train_lr, args.train_seed
            job.envelope = not args.no_envelope
            if args.prompts is not None:
                try:
                    raw = json.loads(args.prompts.read_text())
                except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
                    raise UsageError(f"cannot read --prompts {args.prompts}: {exception_text(e)}")
                job.prompts = parse_prompts(raw, f"--prompts {args.prompts}")
        job.out = Path(os.path.abspath(job.out))
        if job.out.parent == job.out:
            raise UsageError(f"--out {job.out}: not a usable bundle directory")
        check_out_dir(job.out)
    except UsageError as e:
        print(f"reference_cell: {e}", file=sys.stderr)
        return 2

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    job.world_size = world
    job.rank = int(os.environ.get("RANK", "0") or 0) if world > 1 else 0
    job.local_rank = int(os.environ.get("LOCAL_RANK", "0") or 0)

    # A cancel (SIGTERM) unwinds through the finally blocks: no staging folder is left behind.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))

    if args.run_spec is not None:
        # Standard output carries the events and nothing else: whatever else writes to fd 1
        # (a library's print, a C extension) goes to standard error.
        events_stream = os.fdopen(os.dup(1), "w", encoding="utf-8", errors="replace")
        os.dup2(2, 1)
        sys.stdout = sys.stderr
    else:
        events_stream = sys.stderr
    events = Events(events_stream, rank=job.rank if world > 1 else None)
    status = run_phases(job, events, [("identity", identity_phase), ("reference", reference_phase)])
    if args.run_spec is not None:
        return 0
    log(f"run_end {status}" + (f": bundle in {job.out}" if status == "PASS" else ""))
    return 0 if status == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
