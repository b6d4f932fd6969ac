"""`python -m orchestrator <command>` (as inside `ray job submit`): the same CLI as `pd-orchestrator`."""

from orchestrator.cli import main

raise SystemExit(main())
