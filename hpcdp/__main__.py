from hpcdp.cli import main

raise SystemExit(main())
