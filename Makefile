# The two commands a user needs: `make demo` and `make test`. Each installs what it needs
# (scripts/setup.sh: Debian packages and the pinned PyTorch in a venv outside the clone),
# configures CMake with Ninja (+ ccache), builds, and runs. `make python` builds only the Python
# extension (python/tessera/_C*.so) and the CLI.
.PHONY: all build test demo bench python clean

all: build

build:
	@scripts/build.sh

test: build
	@scripts/test.sh

demo: build
	@scripts/demo.sh

bench: build
	@bench/run_collectives.sh 2 256

python:
	@scripts/build.sh tessera_python tessera_cli
	@echo "tessera: built python/tessera/$$(cd python/tessera && ls _C*.so); import it with"
	@echo "  PYTHONPATH=$(CURDIR)/python $$(cat $${BUILD_DIR:-build}/.tessera-python) -c 'import tessera'"

clean:
	rm -rf build python/tessera/_C*.so
