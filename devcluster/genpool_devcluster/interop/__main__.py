import sys

from genpool_devcluster.interop.cli import main

sys.exit(main())
