"""Runs a test script's `test_*` functions in order and reports them.

Every script under tests/serve/ ends with `runner.run(globals())`; the Rust
side (crates/onebit/tests/serve.rs) checks the exit status and the final
"N passed, 0 failed" line.
"""
import sys
import traceback


def run(namespace):
    tests = [v for k, v in namespace.items() if k.startswith("test_")]
    failed = 0
    for t in tests:
        try:
            t()
            print(f"ok      {t.__name__}")
        except Exception:
            failed += 1
            print(f"FAILED  {t.__name__}")
            traceback.print_exc(file=sys.stdout)
    print(f"{len(tests) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)
