import sys

from genpool_cli.main import main

sys.exit(main())
