import sys

from ponder.cli.core import main

sys.exit(main())
