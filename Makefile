# Two commands set up everything on a fresh machine:  make book  and  make test.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
ASSIGNMENTS := $(notdir $(wildcard solutions/[0-9]*))

.PHONY: venv system npm book student-pack test grade exercises check bench-grade clean experiments class-server-deps class-server class-server-stop

# The virtual environment, rebuilt when requirements.txt or pyproject.toml change.
$(STAMP): requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -qq --upgrade pip
	$(PY) -m pip install -qq -r requirements.txt
	$(PY) -m pip install -qq --no-deps --no-build-isolation -e .
	touch $@

venv: $(STAMP)

# Debian packages: bubblewrap (the grading sandbox), Chromium and its driver (browser checks of the book).
system:
	@missing=""; \
	command -v bwrap >/dev/null || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null || missing="$$missing chromium"; \
	command -v chromedriver >/dev/null || missing="$$missing chromium-driver"; \
	if [ -n "$$missing" ]; then \
	  echo "installing Debian packages:$$missing"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing >/dev/null; \
	fi

# npm installs MathJax for the book (served from the built site, never from a CDN).
npm:
	@command -v npm >/dev/null || { \
	  echo "installing Debian packages: npm"; \
	  if [ "$$(id -u)" = 0 ]; then SUDO=; else SUDO=sudo; fi; \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq npm >/dev/null; }

# The class server's proxy: configurable-http-proxy from npm, into _build/chp/ (git-ignored).
CHP_VERSION := 5.3.0
CHP := _build/chp/node_modules/.bin/configurable-http-proxy
$(CHP): | npm
	mkdir -p _build/chp
	npm install --prefix _build/chp --no-audit --no-fund --no-save --loglevel=error configurable-http-proxy@$(CHP_VERSION)

class-server-deps: venv system $(CHP)

# axe-core from npm, into _build/axe/ (git-ignored): tests/test_book_axe.py runs it over every built page.
AXE_VERSION := 4.10.3
AXE := _build/axe/node_modules/axe-core/axe.min.js
$(AXE): | npm
	mkdir -p _build/axe
	npm install --prefix _build/axe --no-audit --no-fund --no-save --loglevel=error axe-core@$(AXE_VERSION)

# A class on one server (docs/class_server.md, "Run a class"); as root:
#   make class-server ROSTER=roster.csv [CLASS_DIR=/srv/resnorm] [IP=127.0.0.1] [PORT=8000]
#   make class-server-stop [CLASS_DIR=/srv/resnorm]
CLASS_DIR ?= /srv/resnorm
IP ?= 127.0.0.1
PORT ?= 8000
class-server: class-server-deps
	@test -n "$(ROSTER)" || { echo "usage: make class-server ROSTER=roster.csv (columns id,first_name,last_name,email,role)"; exit 2; }
	$(PY) -m class_server up $(ROSTER) --dir $(CLASS_DIR) --ip $(IP) --port $(PORT)

class-server-stop:
	$(PY) -m class_server down --dir $(CLASS_DIR)

# The student pack (_build/student-pack.zip: notebooks, the coursekit wheel, a README); the book
# links it and publishes the wheel, so it is built first.
student-pack: venv
	$(PY) -m course.pack

book: venv npm student-pack
	$(PY) -m book.build build

# The experiments too long for a book build (book/experiments/recorded.py): about half an hour on
# 2 cores; they resume (a run recorded with today's code is not rerun) and write book/results/*.json,
# which the book reads and refuses, failing the build, once the code they ran has changed.
experiments: venv
	RECORDED_COMMAND="make experiments" $(PY) -m book.experiments.recorded run

# exercises/ is generated: never edit it by hand, edit solutions/ and run this.
exercises: venv
	$(PY) -m course.release

# A student's self-check: make check NB=exercises/01_layernorm/layernorm.ipynb
check: venv
	$(PY) -m coursekit.selfcheck $(NB)

# Two test files at a time (pytest-xdist; tests/conftest.py pairs them, longest first); TEST_JOBS=0
# runs them one after another in this process.
# MAKE_T0: when make began, so each progress line also says how long make test has run (the venv
# and the book included), which is what CI's time limit counts.
TEST_JOBS ?= 2
MAKE_T0 := $(shell date +%s)
test: venv system book $(CHP) $(AXE)
	MAKE_T0=$(MAKE_T0) $(PY) -m pytest -q --durations=30 $(if $(filter-out 0,$(TEST_JOBS)),-n $(TEST_JOBS))

grade: venv system
	$(PY) -m autograder grade --sample-class --out _build/grades

bench-grade: venv system
	$(PY) -m tools.bench_stock --one-off

clean:
	rm -rf _build .jupyter_cache
