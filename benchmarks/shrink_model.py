"""A model shrunk for a CPU dry run (gloo) of a device script: the same layers, heads, kv
heads, family, experts and top-k, with head dim 8, ffn 2·hidden (the experts' and shared
experts' likewise), vocabulary 512 and sequences of 64 tokens. The layouts a set was drawn
for stay valid: every degree they cut by (heads, kv heads, experts, layers) is kept.

    python benchmarks/shrink_model.py benchmarks/sets/moeh5/m01.json /tmp/dry/m01.json

:func:`tiny_spec` is what ``transfer_round.tiny_set`` shrinks a set's models with; the device
scripts call this file under ``DRY_RUN=cpu`` (``benchmarks/device_env.sh``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from meshplan.errors import MeshplanError  # noqa: E402
from meshplan.spec import ModelSpec  # noqa: E402

SEQ_LEN = 64


def tiny_spec(spec: dict) -> dict:
    """``spec`` (a ModelSpec dict) shrunk: hidden 8 per head, every FFN width 2 × hidden."""
    hidden = 8 * spec["num_heads"]
    out = dict(spec, head_dim=None, vocab_size=512, max_seq_len=SEQ_LEN, hidden_size=hidden,
               ffn_hidden_size=2 * hidden)
    for key in ("moe_ffn_hidden_size", "shared_expert_ffn_hidden_size"):
        if out.get(key):
            out[key] = 2 * hidden
    if out.get("sliding_window"):
        out["sliding_window"] = min(out["sliding_window"], SEQ_LEN // 2)
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: shrink_model.py MODEL.json OUT.json", file=sys.stderr)
        return 2
    src, dst = Path(argv[0]), Path(argv[1])
    try:
        model = ModelSpec.from_dict(tiny_spec(json.loads(src.read_text())))
    except (OSError, ValueError, KeyError, MeshplanError) as e:
        print(f"shrink_model.py: {src}: {e}", file=sys.stderr)
        return 1
    dst.parent.mkdir(parents=True, exist_ok=True)
    dst.write_text(json.dumps(model.to_dict(), indent=1) + "\n")
    print(dst)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
