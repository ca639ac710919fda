# The two commands of the README:
#   make test   set up the machine (Debian packages, Python venv), build, run every test
#   make demo   set up, build, run the demo
SHELL := /bin/bash
BUILD ?= build
BUILD_TYPE ?= RelWithDebInfo
CMAKE_ARGS ?=

.PHONY: all setup configure build test demo demo-seeds demo-compare clean

all: build

setup:
	@scripts/setup.sh

configure: setup
	@cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS) >/dev/null

build: configure
	@cmake --build $(BUILD)

test: build
	@cd $(BUILD) && ctest --output-on-failure --no-label-summary -j2

demo: build
	@$(BUILD)/rpg demo --out runs/demo

# Issue 10's checks of the demo's claim (not tests: they take tens of minutes).
demo-seeds: build
	@RPG=$(BUILD)/rpg scripts/demo_seeds.sh 1 2 3

demo-compare: build
	@$(BUILD)/rpg demo --compare --seeds 1,2,3 --out runs/demo --results docs/demo-results.md

clean:
	rm -rf $(BUILD)
