from torchjob.cli import main

raise SystemExit(main())
