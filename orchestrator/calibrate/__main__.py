"""`python -m orchestrator.calibrate {single,pd,twogpu,nixl-patch,parse-log}` (see the package docstring)."""

import sys

from orchestrator.calibrate.command import main

sys.exit(main())
