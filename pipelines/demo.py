"""`python -m pipelines.demo` is now `python -m demos.demo`: the demo drivers left the code location (demos/).

Kept for one release because the docs told users to run it by that name; it says so and runs the demo.
"""

import sys
import warnings


def main(argv: list[str] | None = None) -> int:
    warnings.warn("`python -m pipelines.demo` is deprecated: run `python -m demos.demo` (same options)",
                  DeprecationWarning, stacklevel=2)
    from demos.demo import main as demo_main

    return demo_main(argv)


if __name__ == "__main__":
    sys.exit(main())
