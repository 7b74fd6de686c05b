from .interfaces.entry import main

raise SystemExit(main())
