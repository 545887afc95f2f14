"""``python -m bench``: run the benchmarks and write bench/results/."""

import sys

from bench.run import main

sys.exit(main())
