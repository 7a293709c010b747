# dfbench — make targets. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# torch/torchvision are installed first and pinned: on the reference machines these releases
# are on local disk. Override with e.g. `make TORCH_SPEC="torch torchvision" test`.
TORCH_SPEC ?= torch==2.14.1 torchvision==0.29.1
RUNS ?= results/runs
DEVICE ?= cpu
CPU_WORKERS ?= 2  # grid worker processes of demo and bench-paper-fmnist, one torch thread each
GRID_ARGS ?=  # extra `dfbench grid` flags, e.g. GRID_ARGS="--shard 0/4 --retry-failed"

.PHONY: help install test test-fast test-unit test-runs test-results demo gt-demo bench-proxy-validity bench-bound bench-start-points bench-start-points-fmnist data-fmnist leaderboard bench-full bench-paper bench-paper-fmnist bench-paper-fmnist-budget bench-paper-fmnist-rules bench-paper-fmnist-rule-losses bench-cpu-aggregation bench-cpu-aggregation-tune bench-cpu-recipe bench-cpu-stragglers bench-cpu-compression bench-cpu-privacy bench-confirmatory bench-confirmatory-2 bench-confirmatory-2-followup bench-confirmatory-3 bench-cpu-experts bench-cpu-bf16 bench-cpu-submodels bench-run-speed bench-metric-calibration bench-comm bench-experts bench-cifar10-gpu bench-cifar10-gpu-plan perf bench-flower bench-submodel-speed gpu-check clean-demo

help: ## list the targets
	@grep -E '^[a-zA-Z0-9_ -]+:.*?## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*?## "}; {printf "  make %-14s %s\n", $$1, $$2}'

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# pip byte-compiles every file it installs one at a time; here it installs without, and
# compileall compiles the same files on every core (-j 0): 39 s of a 3-minute install saved on 2
# cores (results/cpu-recipe/README.md). Like pip, it skips the few files that do not compile for this
# Python (torch's py312 test helpers), hence `|| true`. The venv's own pip (23.2+) is used as it is.
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --no-compile $(TORCH_SPEC)
	$(BIN)/python -m pip install --quiet --no-compile -e '.[test]'
	$(BIN)/python -m compileall -qq -j 0 $(VENV)/lib || true
	touch $@

install: $(VENV)/.installed ## create .venv and install dfbench with its test extras

# The suite spreads its test files over TEST_WORKERS processes (pytest-xdist, a file's tests stay in one
# process: its module fixtures are built once). On this 2-core Xeon: make test 8 min 56 s against 15 min
# in one process, make test-fast 71 s against 127 s. TEST_WORKERS=0 runs everything in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.installed data-fmnist ## run the test suite: tests/unit, tests/runs, tests/results (CPU only, about 9 min on 2 cores)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests

test-fast: $(VENV)/.installed data-fmnist ## every test not marked slow, in all three tiers (about 70 s on 2 cores)
	$(BIN)/python -m pytest -m "not slow" -n $(TEST_WORKERS) --dist loadfile tests

test-unit test-runs test-results: test-%: $(VENV)/.installed data-fmnist ## one tier: tests/unit (maths, formats), tests/runs (whole runs, processes, CLI) or tests/results (committed numbers, docs, pages)
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile tests/$*

# The documentation site (docs/ and mkdocs.yml: MkDocs, the Material theme, API pages by mkdocstrings),
# from the `docs` extra, installed once into the venv; --strict fails on any warning (a broken link or anchor,
# a page missing from the nav, an API page that does not render). CI runs it.
$(VENV)/.docs-installed: $(VENV)/.installed
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

.PHONY: docs
docs: $(VENV)/.docs-installed ## build the documentation site (MkDocs, --strict) into site/
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

demo: $(VENV)/.installed data-fmnist ## set up .venv, train every method family + the untrained model on Fashion-MNIST (~5 min on 2 cores), page in results/demo/, compared with the committed one
	@echo "make demo: 10 cells (9 method families + the untrained model), 2 workers of one torch thread;"
	@echo "  about 5 min on 2 cores (the grid took 4 min 20 s on a 2-core Xeon). Page: results/demo/leaderboard.html"
	@# the report is written even when a cell failed (it lists the failure); make still exits non-zero then
	@# one torch thread per worker, as for the committed numbers (CPU results depend on the thread count)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid demo --workers $(CPU_WORKERS) --out results/demo/runs --device $(DEVICE); status=$$?; \
	$(BIN)/dfbench report --runs results/demo/runs --out results/demo --claims benchmark/grid/builtin/demo.claims.toml && \
	$(BIN)/python results/demo/reproduce.py results/demo results/demo/reference && exit $$status
	@echo "Next, in a new shell: source .venv/bin/activate, then e.g. dfbench methods (README: Usage)"

gt-demo: $(VENV)/.installed ## the ground-truth track's demo: every method family + the exact-score floor and the untrained ceiling on gmm:dim8 (Dirichlet 0.3), trained to the plateau (cap 128 rounds), scored exactly; page in results/gt-demo/ (~10 min on 2 cores)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid gt-demo --workers $(CPU_WORKERS) --out results/gt-demo/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/gt-demo/runs --out results/gt-demo && exit $$status

# issue 60 item 5: which image metric orders models as the exact error does (results/proxy-validity/README.md)
bench-proxy-validity: $(VENV)/.installed data-fmnist ## the proxy-validity study: every image proxy beside the exact error on gmm:fmnist28 (47 cells; 67 min on 2 cores shared with other work), its claims decided, page in results/proxy-validity/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/proxy-validity/proxy-validity.toml --workers $(CPU_WORKERS) --out results/proxy-validity/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/proxy-validity/runs --out results/proxy-validity && \
	$(BIN)/python results/proxy-validity/analyze.py && $(BIN)/python results/proxy-validity/kid_norm.py && exit $$status

# issue 62: the seed paper's bound against the exact error, every seed claim re-decided (results/bound/)
bench-bound: $(VENV)/.installed ## the bound study (issue 62): Qiao et al.'s bound against the exact error, one factor at a time on gmm:dim4, every seed claim re-decided (104 cells; about 35 min on 2 cores), page in results/bound/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/bound/bound.toml --workers $(CPU_WORKERS) --out results/bound/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/bound/runs --out results/bound --claims results/bound/bound.claims.toml && \
	$(BIN)/python results/bound/analyze.py && $(BIN)/python results/bound/seed_claims.py && exit $$status

# issue 63 point 3: what a start from trained weights buys (results/start-points/)
bench-start-points: $(VENV)/.installed ## the start-points study (issue 63): federated flow matching on gmm:dim4 from scratch, from a converted DDPM network and from a network pretrained on a public split (2 + 60 cells; about 8 min on 2 cores), page in results/start-points/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/start-points/pretrain.toml --workers $(CPU_WORKERS) --out results/start-points/pretrain --device $(DEVICE) && \
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/start-points/start-points.toml --workers $(CPU_WORKERS) --out results/start-points/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/start-points/runs --out results/start-points --claims results/start-points/start-points.claims.toml && \
	OMP_NUM_THREADS=1 $(BIN)/python results/start-points/ddim_terminal.py && exit $$status

bench-start-points-fmnist: $(VENV)/.installed data-fmnist ## its Fashion-MNIST half: FedAvg (flow matching) from scratch and from a converted DDPM network, paper-fmnist's recipe, 3 seeds (1 + 7 cells; about 17 min on 2 cores), page in results/start-points-fmnist/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/start-points-fmnist/pretrain.toml --workers 1 --out results/start-points-fmnist/pretrain --device $(DEVICE) && \
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/start-points-fmnist/start-points-fmnist.toml --workers $(CPU_WORKERS) --out results/start-points-fmnist/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/start-points-fmnist/runs --out results/start-points-fmnist --claims results/start-points-fmnist/start-points-fmnist.claims.toml && exit $$status

# Fashion-MNIST (the demo's and the tests' data): found where dfbench looks (DFBENCH_DATA, the system
# path, the fetch cache), else the Debian package where apt-get can install it, else one line saying how.
data-fmnist: $(VENV)/.installed ## Fashion-MNIST for demo and test: the Debian package dataset-fashion-mnist where apt-get works
	@$(BIN)/python -c "import sys; from dfbench.datasets.sources import missing; sys.exit(any(missing('fmnist', s) for s in ('train', 'test')))" && exit 0; \
	if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "Fashion-MNIST not found: installing the Debian package dataset-fashion-mnist"; \
	  apt-get install -y -qq dataset-fashion-mnist >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq dataset-fashion-mnist >/dev/null; }; \
	else \
	  echo "Fashion-MNIST not found. Install it with: sudo apt-get install dataset-fashion-mnist (Debian/Ubuntu), or where there is internet: $(BIN)/dfbench fetch fmnist. Then run make again." >&2; exit 1; \
	fi

leaderboard: $(VENV)/.installed ## report (leaderboard md/csv/html, plots, mosaics) over $(RUNS) into results/
	$(BIN)/dfbench report --runs $(RUNS) --out results

# bench-* fetch the datasets and Inception weights their grid needs first (`--download`: only what is
# missing, checksum-verified; DFBENCH_MIRROR=URL for a mirror); demo and test never download.
bench-full: $(VENV)/.installed ## every method family x 3 datasets x 3 partitions x 3 seeds (GPU budget)
	$(BIN)/dfbench grid full --download --out $(RUNS) --device $(DEVICE) $(GRID_ARGS)

bench-paper: $(VENV)/.installed ## the pruning study (random vs top-k, 5 keep ratios, 3 datasets)
	$(BIN)/dfbench grid paper --download --out $(RUNS) --device $(DEVICE) $(GRID_ARGS)

bench-paper-fmnist: $(VENV)/.installed ## CPU-sized pruning study on Fashion-MNIST (3 seeds; 16 for FedAvg / top-k 0.5 / random 0.5: 76 cells, ~2 h on 2 cores), results in results/paper-fmnist/
	@# the report is written even when a cell failed (it lists the failure); make still exits non-zero then
	@# CPU results depend on torch's intra-op thread count: one thread per worker, as for the
	@# committed numbers (which worker runs a cell, and how many workers there are, changes nothing)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/paper-fmnist/paper-fmnist.toml --download --workers $(CPU_WORKERS) --out results/paper-fmnist/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/paper-fmnist/runs --out results/paper-fmnist --claims results/paper-fmnist/paper-fmnist.claims.toml && \
	$(BIN)/python results/paper-fmnist/paper_figures.py --runs results/paper-fmnist/runs --out results/paper-fmnist && exit $$status

bench-paper-fmnist-budget: $(VENV)/.installed ## FedAvg vs random pruning keep 0.5 at 14/28 rounds on small28/small32, 6 seeds (~3.5 h on 2 cores; reuses bench-paper-fmnist's runs), results in results/paper-fmnist-budget/
	@# the small28 / 14-round cells are paper-fmnist's own runs (same run ids): copied in when that study has run
	$(BIN)/python results/paper-fmnist-budget/share_runs.py --grid results/paper-fmnist-budget/paper-fmnist-budget.toml --from results/paper-fmnist/runs --to results/paper-fmnist-budget/runs
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/paper-fmnist-budget/paper-fmnist-budget.toml --download --workers $(CPU_WORKERS) --out results/paper-fmnist-budget/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/paper-fmnist-budget/runs --out results/paper-fmnist-budget --claims results/paper-fmnist-budget/paper-fmnist-budget.claims.toml && \
	$(BIN)/python results/paper-fmnist-budget/budget_width.py results/paper-fmnist-budget && exit $$status

bench-paper-fmnist-rules: $(VENV)/.installed ## the held-out seed that chose paper-fmnist's inference rules (~30 min on 2 cores), results in results/paper-fmnist/rules/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/paper-fmnist/rules/paper-fmnist-rules.toml --download --workers $(CPU_WORKERS) --out results/paper-fmnist/rules/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/paper-fmnist/rules/runs --out results/paper-fmnist/rules && \
	$(BIN)/python results/paper-fmnist/paper_figures.py --runs results/paper-fmnist/rules/runs --out results/paper-fmnist/rules --choose-rules && \
	$(BIN)/python results/paper-fmnist/pruning_masks.py results/paper-fmnist/rules/runs --out results/paper-fmnist/rules/pruning_masks.csv && exit $$status

bench-paper-fmnist-rule-losses: $(VENV)/.installed ## every inference rule at keep 0.5 scored by fd_fmnist and by training loss, on paper-fmnist's runs (~12 min; run bench-paper-fmnist first), results in results/paper-fmnist/rule_losses/
	OMP_NUM_THREADS=2 $(BIN)/python results/paper-fmnist/rule_losses.py --runs results/paper-fmnist/runs --out results/paper-fmnist/rule_losses --keep 0.5

bench-cpu-aggregation: $(VENV)/.installed ## aggregation baselines on Fashion-MNIST, Dirichlet 0.1/0.5, 3 seeds (~45 min on 2 cores), results in results/cpu-aggregation/
	@# one torch thread per worker, as for the committed numbers; the server learning rates in the
	@# grid come from `make bench-cpu-aggregation-tune` (held-out seed, results/cpu-aggregation/tune/)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-aggregation/cpu-aggregation.toml --download --workers $(CPU_WORKERS) --out results/cpu-aggregation/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-aggregation/runs --out results/cpu-aggregation --claims results/cpu-aggregation/cpu-aggregation.claims.toml && \
	$(BIN)/python scripts/paired.py --runs results/cpu-aggregation/runs --out results/cpu-aggregation && exit $$status

bench-cpu-aggregation-tune: $(VENV)/.installed ## the server-lr sweep behind cpu-aggregation (seed 7, ~20 min on 2 cores), results in results/cpu-aggregation/tune/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-aggregation/tune/cpu-aggregation-tune.toml --download --workers $(CPU_WORKERS) --out results/cpu-aggregation/tune-runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-aggregation/tune-runs --out results/cpu-aggregation/tune && exit $$status

bench-cpu-recipe: $(VENV)/.installed ## FedAvg at an equal training budget under candidate recipes (seeds 7-10, ~45 min on 2 cores), results in results/cpu-recipe/
	@# speed keeps the committed speed.json (--again measures this machine), so grid writes the committed rounds
	$(BIN)/python results/cpu-recipe/cpu_recipe.py speed
	$(BIN)/python results/cpu-recipe/cpu_recipe.py grid
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-recipe/cpu-recipe.toml --download --workers $(CPU_WORKERS) --out results/cpu-recipe/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-recipe/runs --out results/cpu-recipe --claims results/cpu-recipe/cpu-recipe.claims.toml && \
	$(BIN)/python results/cpu-recipe/cpu_recipe.py table && exit $$status

bench-cpu-stragglers: $(VENV)/.installed ## half the clients 4x slower on a simulated clock: sync/deadline/pruning/HeteroFL/FedBuff, 3 seeds (~45 min on 2 cores), results in results/cpu-stragglers/
	@# one torch thread per worker, as for the committed numbers; the pruning cells' inference rule
	@# comes from the held-out seed 7 (results/cpu-stragglers/rules.toml)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-stragglers/cpu-stragglers.toml --download --workers $(CPU_WORKERS) --out results/cpu-stragglers/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-stragglers/runs --out results/cpu-stragglers --claims results/cpu-stragglers/cpu-stragglers.claims.toml && \
	$(BIN)/python results/cpu-stragglers/time_to_quality.py --runs results/cpu-stragglers/runs --out results/cpu-stragglers && \
	$(BIN)/python scripts/speed.py results/cpu-stragglers && exit $$status

bench-cpu-compression: $(VENV)/.installed ## top-k / sign / QSGD / PowerSGD / min-max quantized updates near 8x, 32x, 100x less uplink vs FedAvg, 3 seeds (~40 min on 2 cores), results in results/cpu-compression/
	@# one torch thread per worker, as for the committed numbers
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-compression/cpu-compression.toml --download --workers $(CPU_WORKERS) --out results/cpu-compression/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-compression/runs --out results/cpu-compression --claims results/cpu-compression/cpu-compression.claims.toml && \
	$(BIN)/python scripts/paired.py --runs results/cpu-compression/runs --out results/cpu-compression && \
	$(BIN)/python results/cpu-compression/frontier.py --runs results/cpu-compression/runs --out results/cpu-compression && exit $$status

bench-cpu-bf16: $(VENV)/.installed ## bf16 autocast vs float32 training, paper-fmnist's FedAvg cell, 10 fresh seeds, equivalence within 5 % in three metrics (~35 min on 2 cores), results in results/cpu-bf16/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-bf16/cpu-bf16.toml --download --workers $(CPU_WORKERS) --out results/cpu-bf16/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-bf16/runs --out results/cpu-bf16 --reference 'fedavg?train.amp=off' --claims results/cpu-bf16/cpu-bf16.claims.toml && \
	$(BIN)/python scripts/speed.py results/cpu-bf16 && exit $$status

bench-cpu-submodels: $(VENV)/.installed ## issue 53's sub-model schemes at capacity tiers 1.0/0.5 (slow = small): FedAvg, random/top-k/balanced masks, HeteroFL, FedRolex, FjORD, hierarchical FedAvg, FedPhD, 5 fresh seeds (~75 min on 2 cores), claims pre-registered; results in results/cpu-submodels/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-submodels/cpu-submodels.toml --download --workers $(CPU_WORKERS) --out results/cpu-submodels/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-submodels/runs --out results/cpu-submodels --reference 'fedavg?system.edges=0' --claims results/cpu-submodels/cpu-submodels.claims.toml && \
	$(BIN)/python results/cpu-submodels/submodel_study.py && \
	$(BIN)/python scripts/speed.py results/cpu-submodels && exit $$status

bench-run-speed: $(VENV)/.installed ## one dfbench run of paper-fmnist's FedAvg cell before / after issue 52's speed-ups, side by side (~12 min on 2 cores), results/cpu-bf16/speed_run.md
	$(BIN)/python results/cpu-bf16/run_speed.py

bench-cpu-experts: $(VENV)/.installed ## DDM's routing claim: top-1 vs the full mixture of the same K = 2 experts on paper-fmnist's CPU recipe, 6 seeds (~25 min on 2 cores), results in results/cpu-experts/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-experts/cpu-experts.toml --download --workers $(CPU_WORKERS) --out results/cpu-experts/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-experts/runs --out results/cpu-experts --reference 'experts?mixing=full' --claims results/cpu-experts/cpu-experts.claims.toml && \
	$(BIN)/python scripts/speed.py results/cpu-experts && exit $$status

bench-cpu-privacy: $(VENV)/.installed ## memorization, membership inference and user-level DP: FedAvg, experts, pruning, quantized, DP-FedAvg at 3 noise levels, 3 seeds (~45 min on 2 cores), results in results/cpu-privacy/
	@# one torch thread per worker, as for the committed numbers; DP's clipping bound comes from the
	@# held-out seed 7 (the comments of results/cpu-privacy/cpu-privacy.toml)
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/cpu-privacy/cpu-privacy.toml --download --workers $(CPU_WORKERS) --out results/cpu-privacy/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cpu-privacy/runs --out results/cpu-privacy --claims results/cpu-privacy/cpu-privacy.claims.toml && \
	$(BIN)/python results/cpu-privacy/privacy.py --runs results/cpu-privacy/runs --out results/cpu-privacy && \
	$(BIN)/python scripts/speed.py results/cpu-privacy && exit $$status

bench-confirmatory: $(VENV)/.installed ## issue 54's confirmatory re-runs on fresh seeds, claims pre-registered: top-k vs random masks at keep 0.5 (paper-fmnist's cells), 8-bit quantized updates vs FedAvg (cpu-compression's), top-1 vs full-mixture experts (cpu-experts'); 30 cells, seeds 401-407 (~35 min on 2 cores; dry run ~38 min), results in results/confirmatory/
	@# one torch thread per worker, as for the exploratory runs. Commit confirmatory.claims.toml before the first
	@# cell: the report checks that every run started after the claims file's last commit and exits 1 if not
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/confirmatory/confirmatory.toml --download --workers $(CPU_WORKERS) --out results/confirmatory/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/confirmatory/runs --out results/confirmatory --reference 'experts?mixing=full' --claims results/confirmatory/confirmatory.claims.toml && \
	$(BIN)/python scripts/speed.py results/confirmatory && exit $$status

bench-confirmatory-2: $(VENV)/.installed ## issue 54's second confirmatory batch, claims pre-registered: the server optimizers and SCAFFOLD vs the tuned FedAvg at Dirichlet 0.1 (cpu-aggregation's cells, seeds 501-508), the adopted recipe vs the old one (cpu-recipe's, 501-505); 58 cells (~50-60 min on 2 cores), results in results/confirmatory-2/
	@# one torch thread per worker, as for the exploratory runs. Commit confirmatory-2.claims.toml before the first
	@# cell: the report checks that every run started after the claims file's last commit and exits 1 if not.
	@# The leaderboard's reference is each block's batch-32 FedAvg: the tuned FedAvg at Dirichlet 0.1, the old recipe at 0.5
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/confirmatory-2/confirmatory-2.toml --download --workers $(CPU_WORKERS) --out results/confirmatory-2/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/confirmatory-2/runs --out results/confirmatory-2 --reference 'fedavg?train.batch_size=32' --claims results/confirmatory-2/confirmatory-2.claims.toml && \
	$(BIN)/python scripts/speed.py results/confirmatory-2 && exit $$status

bench-confirmatory-2-followup: $(VENV)/.installed ## exploratory follow-up of confirmatory-2: the server optimizers' eta at Dirichlet 0.1 and 18 rounds, seeds 601-603 (39 cells, ~30 min on 2 cores), results/confirmatory-2/followup/
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/confirmatory-2/followup/followup.toml --download --workers $(CPU_WORKERS) --out results/confirmatory-2/followup/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/confirmatory-2/followup/runs --out results/confirmatory-2/followup && \
	$(BIN)/python results/confirmatory-2/followup/followup.py && exit $$status

bench-confirmatory-3: $(VENV)/.installed ## issue 54's confirmatory re-run of Qiao et al.'s top-k vs random masks at keep 0.75 (seeds 701-711) and 0.25 (701-710), sized from the upper bound of the pilot spread, paper-fmnist's cells, claims pre-registered; 42 cells (~85 min on 2 cores), results in results/confirmatory-3/
	@# one torch thread per worker, as for the exploratory runs; the report checks that every run started after the
	@# claims file's last commit and exits 1 if not
	OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE $(BIN)/dfbench grid results/confirmatory-3/confirmatory-3.toml --download --workers $(CPU_WORKERS) --out results/confirmatory-3/runs --device $(DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/confirmatory-3/runs --out results/confirmatory-3 --claims results/confirmatory-3/confirmatory-3.claims.toml && exit $$status

bench-metric-calibration: $(VENV)/.installed ## every Fashion-MNIST metric on 9 families of graded degradation of 1000 real test images, 2 subsets (11-15 min on 2 cores), results in results/metric-calibration/
	@# one torch thread (and one BLAS thread): the committed numbers are for one, and results depend on it
	OMP_NUM_THREADS=1 $(BIN)/python results/metric-calibration/calibration.py --out results/metric-calibration

bench-comm: $(VENV)/.installed ## FedAvg vs quantized updates at 8/4/2 bits
	$(BIN)/dfbench grid comm --download --out $(RUNS) --device $(DEVICE) $(GRID_ARGS)

bench-experts: $(VENV)/.installed ## decentralized expert mixtures vs FedAvg at the same compute
	$(BIN)/dfbench grid experts --download --out $(RUNS) --device $(DEVICE) $(GRID_ARGS)

# The seed paper's study on one GPU. The plan (results/cifar10-gpu/gpu_plan.py) checks first what the
# machine has (CIFAR-10 and its checksums, the Inception weights, KID, CUDA, diffusers, the model;
# DINOv2's file is optional), all at once with what to fetch from where, and plans the GPU-hours from
# the throughput it measures on the GPU (elsewhere: a stated H200 estimate, said so); a required item
# missing stops the target before its first cell. `make -n bench-cifar10-gpu` (--dry-run) runs the plan
# in its dry-run mode (the `+` line) and only prints the rest. The -plan target installs only into a
# fresh clone (no .venv/.installed yet), never again: it is what one runs on a machine to ask what it lacks.
GPU_DEVICE ?= cuda
CIFAR10_GPU_DRY = $(findstring n,$(firstword -$(MAKEFLAGS)))
bench-cifar10-gpu: $(VENV)/.installed ## the seed paper's pruning study on CIFAR-10 for one GPU: DDPM's UNet, FedAvg vs random / top-k at keep 0.75/0.5/0.25, FID + KID on 10k samples, 3-10 seeds (60 cells), and issue 53's sub-models on the same UNet built width-aware (ddpm32: FedAvg, HeteroFL, FedRolex, FjORD at tiers 1.0/0.4, random / balanced masks at keep 0.5, FedPhD and hierarchical FedAvg under 2 edge servers, 3 seeds: 24 cells); 84 cells, ~37 GPU-hours on an H200, estimated; results in results/cifar10-gpu/
	+$(BIN)/python results/cifar10-gpu/gpu_plan.py results/cifar10-gpu/cifar10-gpu.toml --device $(GPU_DEVICE) $(if $(CIFAR10_GPU_DRY),--dry-run,--save results/cifar10-gpu/throughput.json)
	@# the report is written even when a cell failed (it lists the failure); make still exits non-zero then
	$(BIN)/dfbench grid results/cifar10-gpu/cifar10-gpu.toml --out results/cifar10-gpu/runs --device $(GPU_DEVICE) $(GRID_ARGS); status=$$?; \
	$(BIN)/dfbench report --runs results/cifar10-gpu/runs --out results/cifar10-gpu --claims results/cifar10-gpu/cifar10-gpu.claims.toml && \
	$(BIN)/python results/paper-fmnist/paper_figures.py --runs results/cifar10-gpu/runs --out results/cifar10-gpu --model diffusers-ddpm-cifar10 && exit $$status

bench-cifar10-gpu-plan: $(if $(wildcard $(VENV)/.installed),,$(VENV)/.installed) ## bench-cifar10-gpu's preflight and plan only (exit 0): what this machine lacks and where to get it, the cells, the GPU-hours (measured on a GPU, else estimated), the seeds each claim needs
	$(BIN)/python results/cifar10-gpu/gpu_plan.py results/cifar10-gpu/cifar10-gpu.toml --device $(GPU_DEVICE) --dry-run

perf: $(VENV)/.installed ## side-by-side speed table, written to results/perf.md
	$(BIN)/dfbench perf --device $(DEVICE)

# Flower's simulation engine runs the same FedAvg work as dfbench's round (benchmark/flower_bench.py): the `flower`
# extra is installed into the venv on first use. OMP_NUM_THREADS is unset: the script gives ours the machine's cores
# (as a lone `dfbench run` has) and each Flower client num_cpus threads itself. FLOWER_ARGS: e.g. "--repeats 5".
FLOWER_ARGS ?=
bench-flower: $(VENV)/.installed ## dfbench's round vs Flower's simulation engine, same FedAvg work at 2/10/40 local steps, 3 repeats (installs flwr[simulation]), table in results/perf/flower.md
	@$(BIN)/python -c "import flwr" 2>/dev/null || $(BIN)/python -m pip install --quiet -e '.[flower]'
	env -u OMP_NUM_THREADS $(BIN)/python -m dfbench.benchmark.flower_bench --out results/perf --rounds 2 $(FLOWER_ARGS)

# What a capacity-c client's sub-model saves in training speed (results/perf/submodel_speed.py, issue 53): one client's
# local training through each method's own plan, timed with one torch thread (a parallel run's client worker).
# Run it on an idle machine. SUBMODEL_SPEED_ARGS: e.g. "--repeats 9" or "--preset small32".
SUBMODEL_SPEED_ARGS ?=
bench-submodel-speed: $(VENV)/.installed ## one client's training images/s at capacity 1.0/0.75/0.5/0.25 vs a full FedAvg client: HeteroFL / FedRolex / FjORD sub-models and random / balanced / top-k masks (small28, batch 16, 1 thread, ~4 min), table in results/perf/submodel_speed.md
	$(BIN)/python results/perf/submodel_speed.py --out results/perf $(SUBMODEL_SPEED_ARGS)

gpu-check: ## on a CUDA machine: smoke runs, CUDA-only flags + determinism, Fashion-MNIST sequential/batched, torchrun/NCCL, perf -> results/gpu-check.md (<= 10 min; runs this checkout uninstalled, pip-installs missing deps; PYTHON=... picks the interpreter)
	scripts/gpu_check.sh

clean-demo: ## delete what make demo wrote (its run folders and page); the committed reference and reproduce.py stay
	find results/demo -mindepth 1 -maxdepth 1 ! -name README.md ! -name reference ! -name reproduce.py -exec rm -rf {} +
