from reflectrl.cli import main

raise SystemExit(main())
