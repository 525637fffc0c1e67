from gputrain.cli import main

raise SystemExit(main())
