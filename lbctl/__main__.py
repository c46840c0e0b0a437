import sys

from lbctl.cli import main

sys.exit(main())
