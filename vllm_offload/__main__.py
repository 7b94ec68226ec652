import sys

from vllm_offload.cli import main

sys.exit(main())
