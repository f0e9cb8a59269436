"""`python -m sglang_feather.patches check|apply|revert [--root DIR]`: the SGLang source patch set."""

from __future__ import annotations

import argparse
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from sglang_feather.patches import (
    SGLANG_VERSION,
    PatchError,
    PatchState,
    RollbackError,
    apply,
    installed_root,
    revert,
    status,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sglang_feather.patches", description=__doc__)
    parser.add_argument("action", choices=("check", "apply", "revert"))
    parser.add_argument(
        "--root",
        type=Path,
        help="directory that holds sglang/ (default: the installed SGLang's site-packages; "
        "python/ in an SGLang source checkout)",
    )
    args = parser.parse_args(argv)
    try:
        root = args.root or _installed_root_checked()
        if args.action == "check":
            states = status(root)
            for item in states:
                print(f"{item.state.value:10s} {item.patch.name}")
                if item.detail:
                    print("    " + item.detail.replace("\n", "\n    "))
            kinds = {item.state for item in states}
            print(f"root: {root}")
            return 0 if kinds in ({PatchState.APPLIED}, {PatchState.APPLICABLE}) else 1
        done = apply(root) if args.action == "apply" else revert(root)
        verb = "applied" if args.action == "apply" else "reverted"
        print(f"{verb} {len(done)} patch(es) under {root}" + "".join(f"\n  {p.name}" for p in done))
        return 0
    except RollbackError as err:
        print(f"error: {err}", file=sys.stderr)
        return 3
    except PatchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def _installed_root_checked() -> Path:
    try:
        found = version("sglang")
    except PackageNotFoundError:
        raise PatchError("SGLang is not installed in this Python environment") from None
    if found != SGLANG_VERSION:
        raise PatchError(
            f"installed SGLang is {found}; this patch set is for {SGLANG_VERSION} (use --root to force)"
        )
    return installed_root()


if __name__ == "__main__":
    sys.exit(main())
