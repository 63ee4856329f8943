#!/usr/bin/env python3
"""Checks that the config fields docs/config-fields.md says upstream never reads are indeed read
nowhere in the installed transformers' code for that model type.

For each table row (family | model_type | field | ...) it searches
transformers/models/<model_type>/modeling_<model_type>.py and configuration_<model_type>.py for
the field name as a word. Exit status 1, naming the file and line, when one is found (the family
must then read the field instead of ignoring it), 0 otherwise.

  python tools/refgen/check_unread_fields.py [--doc docs/config-fields.md]
"""

import argparse
import re
import sys
from pathlib import Path

import transformers

ROOT = Path(__file__).resolve().parents[2]


def rows(doc):
    """(model_type, field) of every table row after the header."""
    out = []
    for line in doc.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 3 and cells[0] not in ("family", "") and not set(cells[0]) <= set("-"):
            out.append((cells[1], cells[2]))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--doc", type=Path, default=ROOT / "docs" / "config-fields.md")
    args = ap.parse_args()
    models = Path(transformers.__file__).resolve().parent / "models"
    found, checked = [], rows(args.doc)
    if not checked:
        print(f"{args.doc}: no table rows", file=sys.stderr)
        return 1
    for model_type, field in checked:
        files = [models / model_type / f"{kind}_{model_type}.py" for kind in ("modeling", "configuration")]
        missing = [f for f in files if not f.is_file()]
        if missing:
            found.append(f"{model_type}: {missing[0]} does not exist")
            continue
        word = re.compile(rf"\b{re.escape(field)}\b")
        for f in files:
            for n, line in enumerate(f.read_text().splitlines(), 1):
                if word.search(line):
                    found.append(f"{field}: {f}:{n}: {line.strip()}")
    for line in found:
        print(line)
    print(f"{len(checked)} field(s) checked against transformers {transformers.__version__}: "
          f"{'all unread' if not found else f'{len(found)} read'}")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
