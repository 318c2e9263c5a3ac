from lockstep_agent.cli import main

raise SystemExit(main())
