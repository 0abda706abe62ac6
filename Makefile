# The two commands a user needs: `make demo` and `make test`. Each installs what it needs
# (scripts/setup.sh: Debian packages and the pinned PyTorch in a venv outside the clone),
# configures CMake with Ninja (+ ccache), builds, installs the Python package into the venv
# (`pip install --no-build-isolation -e .`), and runs. `make python` does only that install and the CLI.
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
	@echo "tessera: installed into $$(cat $${BUILD_DIR:-build}/.tessera-python | xargs dirname | xargs dirname) (editable); import it with"
	@echo "  $$(cat $${BUILD_DIR:-build}/.tessera-python) -c 'import tessera'    (or: source scripts/env.sh; python -c 'import tessera')"

clean:
	-$$(cat $${BUILD_DIR:-build}/.tessera-python 2>/dev/null || echo false) -m pip uninstall -y -q tessera
	rm -rf build python/tessera/_C*.so
