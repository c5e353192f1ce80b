import sys

from attnspec import main

sys.exit(main())
