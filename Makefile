# The two commands a user needs: `make demo` and `make test`. Each installs what it needs
# (scripts/setup.sh: Debian packages and the pinned PyTorch in a venv outside the clone),
# configures CMake with Ninja (+ ccache), builds, and runs.
.PHONY: all build test demo bench clean

all: build

build:
	@scripts/build.sh

test: build
	@scripts/test.sh

demo: build
	@scripts/demo.sh

bench: build
	@bench/run_collectives.sh 2 256

clean:
	rm -rf build
