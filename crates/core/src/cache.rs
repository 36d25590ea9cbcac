//! The reference compile cache (docs/semantics.md): a small driver a JIT front-end
//! can use as is.
//!
//! A [`CompileCache`] stands for one compiled function (one frame). It holds
//! compiled entries with guards; [`CompileCache::call`] looks up an entry
//! for the current inputs and, on a miss, runs the protocol — preflight
//! (record this call's inputs, everything static) → one exchange →
//! decisions from (persisted state ⊔ every rank's observations) — and
//! compiles through a user callback. The joined state is what every rank
//! persists, so all ranks keep identical state.
//!
//! Guards follow PyTorch Dynamo's automatic-dynamic behaviour (measured
//! against torch 2.13 by `tests/pytorch-oracle`), each a knob of
//! [`CacheOptions`]:
//! - a static size / int must equal the value compiled for;
//! - a dynamic size is free, except that sizes 0 and 1 stay specialised
//!   (`specialize_zero_one`): a dimension decided dynamic but seen as 0 or 1
//!   is compiled static, and a dynamic size only matches values ≥ 2;
//! - a dynamic int is free, 0 and 1 included: Dynamo creates
//!   automatic-dynamic int symbols with `do_not_specialize_zero_one`;
//! - duck sizing (`duck_sizing`, default off): dynamic sizes equal at compile
//!   time share a symbol and must stay equal to match. Dynamo duck-shapes only
//!   dims it creates as `DimDynamic.DUCK` (compiles with `dynamic=True`), not
//!   the `DimDynamic.DYNAMIC` dims of automatic dynamic, so it is off here;
//!   turn it on to model a `dynamic=True` front-end;
//! - after `recompile_limit` (8) compiles the function runs uncompiled;
//! - guard votes (`guard_collectives`) are taken at every call that has
//!   entries to check, as Dynamo's guard collective is: a frame's first call
//!   compiles on every rank without a vote;
//! - a float is guarded by Python's `==` with its type (`EQUALS_MATCH`: `3`
//!   misses an entry compiled for `3.0`, `-0.0` hits one compiled for
//!   `0.0`; a NaN entry takes only a NaN, `FLOAT_IS_NAN`); a dynamic float
//!   takes any float but a NaN (`not math.isnan`, Dynamo's implicit guard);
//!   a bool by identity (`BOOL_MATCH`; `1` misses an entry compiled for
//!   `True`), never dynamic, never recorded in the state.
//!
//! # How the state is updated: Dynamo's fold
//! After each compile's exchange the state becomes what Dynamo's
//! `process_automatic_dynamic` computes (torch/_dynamo/pgo.py): the state
//! folded with every rank's entries in rank order, `entry |= state`
//! ([`SizeEntry::fold`], Python's `==` on scalars), or, with
//! [`CacheOptions::automatic_dynamic_shapes`] off, overwritten by them (the
//! last rank's entry wins, and nothing becomes dynamic from the state).
//! Where no rank sent a float or bool scalar the fold is the join of the
//! states, computed as such; otherwise the cache folds every rank's state
//! from the exchange ([`crate::protocol::Gathered::per_rank`]). The
//! hierarchical exchange (from `DEFAULT_HIERARCHICAL_FROM` ranks, automatic
//! dynamic on) moves joins only: there the cache joins (docs/semantics.md,
//! The reference compile cache). What each rank sends is its state folded
//! with this call's entries, so that folding those gives the fold of the
//! entries themselves.
//!
//! With [`CacheOptions::automatic_dynamic_exclusion_guard`] (Dynamo's
//! `automatic_dynamic_exclusion_guard`) and compiler collectives off, an
//! entry made where a size or int turned dynamic rejects the inputs equal to
//! the values it turned dynamic from (`excluded_sizes` / `excluded_scalar`,
//! recorded by `FrameStateSizeEntry.__ior__`; the guard is built by
//! `ShapeEnv.produce_guards`), so they fall through to the older entry. With
//! collectives on Dynamo builds no such guard, and neither does the cache.
//!
//! # Which local rules make a rank miss alone
//! With collectives on and guard votes off, only compiles exchange, so every
//! rank must miss at the same calls. A rank misses alone when its inputs
//! change where the others' do not (different data), when a dimension decided
//! dynamic is 0 or 1 on that rank only (0/1 specialisation of sizes), when
//! duck-sized dimensions become unequal on one rank, or when one rank hits the recompile
//! limit first. Then the ranks that missed wait at an exchange the others
//! never enter and fail with [`Error::Timeout`] (or
//! [`Error::PeerLost`] once a peer shuts down) naming
//! them. Turn guard votes on (`guard_collectives`) to make every rank
//! recompile whenever any rank misses; it costs one small exchange per call.
//!
//! # Persistent artifacts
//! [`CompileCache::call_persistent`] (module [`crate::persistence::artifacts`]) compiles
//! through an on-disk artifact store. A rank whose store is warm while
//! another's is cold is one more way to fall out of step (it skips the
//! compile's own collectives); cache-hit agreement
//! ([`CacheOptions::cache_hit_agreement`], default on) keeps a disk hit only
//! if every rank hit.

use crate::decisions::lattice::{canonical_strides, Atom, Dims, Scalar, SizeEntry, Stride};
use crate::decisions::shapes::{
    decide, overrides_text, FrameState, Observation, Override, SourceDecision,
};
use crate::decisions::votes::AnyVote;
use crate::error::{Error, Result};
use crate::protocol::join::Join;
use crate::protocol::Channel;
use crate::protocol::PerRank;
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// The most dimensions [`CompileCache::mark_dynamic`] takes (the scenario
/// format's default `max_ndim`).
pub const MAX_MARK_NDIM: usize = 64;

/// One call's inputs: source name → what was passed.
pub type Inputs = BTreeMap<String, Observation>;

/// Knobs of a [`CompileCache`], built with `CacheOptions::default().with_…`
/// (one `with_<field>` setter per field). Defaults are PyTorch's.
#[derive(Clone, Debug, PartialEq, Eq, derive_setters::Setters)]
#[setters(prefix = "with_")]
#[non_exhaustive]
pub struct CacheOptions {
    /// Exchange observations at every compile (compiler collectives). Default on.
    pub collectives: bool,
    /// Vote at every call: any rank's miss makes every rank recompile. Default off.
    pub guard_collectives: bool,
    /// Compiles (a count) after which the function runs uncompiled. Default 8.
    pub recompile_limit: u32,
    /// Sizes 0 and 1 stay specialised (ints never are). Default on.
    pub specialize_zero_one: bool,
    /// Equal dynamic sizes share a symbol. Default off, as Dynamo's
    /// automatic dynamic (see the module docs).
    pub duck_sizing: bool,
    /// Per-source overrides, by source name; every rank must hold the same
    /// ones. Default none.
    pub overrides: BTreeMap<String, Override>,
    /// With a persistent artifact store ([`crate::persistence::artifacts`]): keep a disk
    /// hit only if every rank hit, else every rank compiles. Default on.
    pub cache_hit_agreement: bool,
    /// Dynamo's `automatic_dynamic_shapes`: a size, int or float seen with
    /// two values becomes dynamic. Off, the state is overwritten by each
    /// rank's entries in rank order instead of folded, and only this rank's
    /// own mark-dynamic hints make a dim dynamic. Every rank must hold the
    /// same. Default on.
    pub automatic_dynamic_shapes: bool,
    /// Dynamo's `automatic_dynamic_exclusion_guard`: with compiler
    /// collectives off, an entry made where a size or int turned dynamic
    /// rejects the inputs equal to the values it turned dynamic from (see
    /// the module docs). Every rank must hold the same. Default off.
    pub automatic_dynamic_exclusion_guard: bool,
}

impl Default for CacheOptions {
    fn default() -> Self {
        CacheOptions {
            collectives: true,
            guard_collectives: false,
            recompile_limit: 8,
            specialize_zero_one: true,
            duck_sizing: false,
            overrides: BTreeMap::new(),
            cache_hit_agreement: true,
            automatic_dynamic_shapes: true,
            automatic_dynamic_exclusion_guard: false,
        }
    }
}

impl CacheOptions {
    /// Canonical text of the options every rank must share (sent as the
    /// exchange configuration). The two Dynamo settings are named only when
    /// they differ from their defaults.
    pub fn config_text(&self) -> String {
        let mut text = format!(
            "votes={} limit={} spec01={} duck={} overrides={{{}}}",
            u8::from(self.guard_collectives),
            self.recompile_limit,
            u8::from(self.specialize_zero_one),
            u8::from(self.duck_sizing),
            overrides_text(&self.overrides)
        );
        if !self.automatic_dynamic_shapes {
            text.push_str(" automatic_dynamic=0");
        }
        if self.automatic_dynamic_exclusion_guard {
            text.push_str(" exclusion_guard=1");
        }
        text
    }
}

/// The guard on one size or int.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DimGuard {
    /// Must equal this value.
    Static(i128),
    /// Size symbol `n`: free (≥ 2 under 0/1 specialisation); equal symbols
    /// must bind equal values.
    Symbol(u32),
    /// Any value (a dynamic int).
    Free,
}

/// The guard on one float.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FloatGuard {
    /// Must be a float `==` this one (IEEE 754 bits): Python's `==`, so
    /// `-0.0` matches `0.0`; a NaN matches any NaN.
    Static(u64),
    /// Any float but a NaN (a float compiled symbolically).
    Free,
}

impl FloatGuard {
    /// Whether the float `v` passes.
    pub fn matches(&self, v: f64) -> bool {
        match *self {
            FloatGuard::Static(bits) => {
                let want = f64::from_bits(bits);
                if want.is_nan() {
                    v.is_nan()
                } else {
                    v == want
                }
            }
            FloatGuard::Free => !v.is_nan(),
        }
    }
}

/// The guard on one source.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SourceGuard {
    /// Must be `None`.
    None,
    /// Must be an int.
    Int(DimGuard),
    /// Must be a float.
    Float(FloatGuard),
    /// Must be this bool.
    Bool(bool),
    /// Must be a tensor of this many dimensions, with these sizes and
    /// canonical strides (`None` = free).
    Tensor {
        /// One guard per dimension.
        sizes: Vec<DimGuard>,
        /// Canonical stride per dimension; `None` where the stride is dynamic.
        strides: Vec<Option<Stride>>,
    },
}

/// One compiled entry: its guards and what was decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CompiledFrame {
    /// 0-based compile number of this frame on this rank.
    pub index: u32,
    /// Guards per source (every source the function saw at this compile).
    pub guards: BTreeMap<String, SourceGuard>,
    /// The group's decision per source, before 0/1 specialisation.
    pub decisions: BTreeMap<String, SourceDecision>,
    /// Realised dynamic size dimensions per tensor source (sorted).
    pub dynamic_dims: BTreeMap<String, Vec<usize>>,
    /// Int sources compiled symbolically.
    pub dynamic_scalars: BTreeSet<String>,
    /// For tensors whose sizes are all static, the dims whose stride is dynamic.
    pub dynamic_strides: BTreeMap<String, Vec<usize>>,
    /// Whether the exchange of this compile took the digest fast path.
    pub fast_path: Option<bool>,
    /// The exclusion guard ([`CacheOptions::automatic_dynamic_exclusion_guard`]):
    /// the entry rejects inputs that equal every one of these values. Empty
    /// when there is none.
    pub exclusions: Vec<Exclusion>,
}

/// One value an entry's exclusion guard names: a dynamic size dim or int
/// and the value it turned dynamic from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Exclusion {
    /// The source.
    pub source: String,
    /// The size dim, or `None` for an int.
    pub dim: Option<usize>,
    /// The value it turned dynamic from.
    pub value: i128,
}

impl Exclusion {
    /// Whether the input holds this value here.
    fn holds(&self, inputs: &Inputs) -> bool {
        match (inputs.get(&self.source), self.dim) {
            (Some(Observation::Int(v)), None) => i128::from(*v) == self.value,
            (Some(Observation::Tensor { sizes, .. }), Some(d)) => {
                sizes.get(d).is_some_and(|v| i128::from(*v) == self.value)
            }
            _ => false,
        }
    }
}

impl CompiledFrame {
    /// Whether `inputs` satisfy this entry's guards.
    pub fn matches(&self, inputs: &Inputs, specialize_zero_one: bool) -> bool {
        // A source the entry never saw must be None now.
        if inputs
            .iter()
            .any(|(s, o)| !matches!(o, Observation::None) && !self.guards.contains_key(s))
        {
            return false;
        }
        let mut bindings: HashMap<u32, i128> = HashMap::new();
        let mut dim_ok = |g: &DimGuard, v: i128| match *g {
            DimGuard::Static(want) => v == want,
            DimGuard::Free => true,
            DimGuard::Symbol(sym) => {
                if specialize_zero_one && (v == 0 || v == 1) {
                    return false;
                }
                *bindings.entry(sym).or_insert(v) == v
            }
        };
        for (source, guard) in &self.guards {
            let obs = inputs.get(source).unwrap_or(&Observation::None);
            let ok = match (guard, obs) {
                (SourceGuard::None, Observation::None) => true,
                (SourceGuard::Int(g), Observation::Int(v)) => dim_ok(g, i128::from(*v)),
                (SourceGuard::Float(g), Observation::Float(bits)) => {
                    g.matches(f64::from_bits(*bits))
                }
                (SourceGuard::Bool(b), Observation::Bool(v)) => b == v,
                (SourceGuard::Tensor { sizes, strides }, Observation::Tensor { sizes: s, .. }) => {
                    if sizes.len() != s.len() {
                        false
                    } else {
                        let st = obs.strides().unwrap_or_default();
                        let canon = canonical_strides(s, &st);
                        sizes.iter().zip(s).all(|(g, v)| dim_ok(g, i128::from(*v)))
                            && strides
                                .iter()
                                .zip(&canon)
                                .all(|(g, c)| g.as_ref().is_none_or(|g| g == c))
                    }
                }
                _ => false,
            };
            if !ok {
                return false;
            }
        }
        // The exclusion guard rejects only when every pair holds.
        self.exclusions.is_empty() || !self.exclusions.iter().all(|e| e.holds(inputs))
    }
}

/// What one [`CompileCache::call`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// An existing entry matched (index into [`CompileCache::frames`]).
    Hit(usize),
    /// A new entry was compiled (index into [`CompileCache::frames`]).
    Compiled(usize),
    /// The recompile limit was reached; the function runs uncompiled.
    Uncompiled,
}

/// The reference compile cache of one function. `A` is the compiled artifact.
#[derive(Debug)]
pub struct CompileCache<A> {
    key: String,
    options: CacheOptions,
    state: FrameState,
    hints: FrameState,
    /// Per source, the values of the last transition to dynamic (Dynamo's
    /// `excluded_sizes` / `excluded_scalar`); kept for the exclusion guard.
    excluded: BTreeMap<String, Excluded>,
    frames: Vec<CompiledFrame>,
    artifacts: Vec<A>,
    compile_calls: Vec<u64>,
    calls: u64,
}

impl<A> CompileCache<A> {
    /// A cache for the function with compile key `key` (canonical and equal
    /// on every rank, e.g. `"train_step@model.rs:88"`).
    pub fn new(key: impl Into<String>, options: CacheOptions) -> Self {
        CompileCache {
            key: key.into(),
            options,
            state: FrameState::new(),
            hints: FrameState::new(),
            excluded: BTreeMap::new(),
            frames: Vec::new(),
            artifacts: Vec::new(),
            compile_calls: Vec::new(),
            calls: 0,
        }
    }

    /// Starts from a persisted state (a profile), as if earlier compiles had
    /// seen it.
    #[must_use]
    pub fn with_state(mut self, state: FrameState) -> Self {
        self.state = state;
        self
    }

    /// Marks dimension `dim` of tensor source `source` (with `ndim`
    /// dimensions) dynamic on this rank (PyTorch's
    /// `torch._dynamo.mark_dynamic`). The hint is sent at every compile, so
    /// it propagates to every rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (nothing recorded) when `dim >= ndim` or
    /// `ndim` is over [`MAX_MARK_NDIM`].
    pub fn mark_dynamic(&mut self, source: &str, ndim: usize, dim: usize) -> Result<()> {
        if ndim > MAX_MARK_NDIM || dim >= ndim {
            return Err(Error::InvalidArgument(format!(
                "mark_dynamic('{source}', ndim {ndim}, dim {dim}): dim must be below ndim, \
                 and ndim at most {MAX_MARK_NDIM}"
            )));
        }
        self.hints.record_entry(
            source,
            &crate::decisions::lattice::SizeEntry::mark_dynamic(ndim, dim),
        );
        Ok(())
    }

    /// The options.
    pub fn options(&self) -> &CacheOptions {
        &self.options
    }

    /// The compile key.
    pub fn key(&self) -> &str {
        &self.key
    }

    /// The persisted state (identical on every rank with collectives on).
    pub fn state(&self) -> &FrameState {
        &self.state
    }

    /// Compiled entries, oldest first.
    pub fn frames(&self) -> &[CompiledFrame] {
        &self.frames
    }

    /// The artifact of entry `i`.
    pub fn artifact(&self, i: usize) -> Option<&A> {
        self.artifacts.get(i)
    }

    /// Number of frame compiles so far.
    pub fn compiles(&self) -> usize {
        self.frames.len()
    }

    /// The 0-based call numbers at which compiles happened.
    pub fn compile_calls(&self) -> &[u64] {
        &self.compile_calls
    }

    fn lookup(&self, inputs: &Inputs) -> Option<usize> {
        // Newest entry first, as Dynamo does.
        (0..self.frames.len())
            .rev()
            .find(|&i| self.frames[i].matches(inputs, self.options.specialize_zero_one))
    }

    /// Runs one call of the function: guard lookup, optional guard vote, and
    /// on a miss a compile (with one exchange when collectives are on).
    ///
    /// `channel` is needed when `collectives` or `guard_collectives` is on.
    /// `compile` receives the new entry and returns the artifact.
    ///
    /// Cost: with guard votes, one exchange per call (an [`AnyVote`]); with
    /// collectives, one exchange per compile (a [`FrameState`]).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a channel is needed and missing, or an
    /// input is malformed (strides of another length than sizes); the
    /// channel's errors ([`Error::Timeout`], [`Error::Desync`], …) otherwise.
    pub fn call<F>(
        &mut self,
        inputs: &Inputs,
        channel: Option<&mut Channel>,
        compile: F,
    ) -> Result<Outcome>
    where
        F: FnOnce(&CompiledFrame) -> A,
    {
        self.call_inner(inputs, channel, "", |frame, _| Ok(compile(frame)))
    }

    /// [`CompileCache::call`] with configuration text appended to the
    /// options' (`extra_config`, shared by every rank) and a fallible compile
    /// that may exchange on the channel (the persistent artifact path,
    /// `crate::persistence::artifacts`).
    pub(crate) fn call_inner<F>(
        &mut self,
        inputs: &Inputs,
        mut channel: Option<&mut Channel>,
        extra_config: &str,
        compile: F,
    ) -> Result<Outcome>
    where
        F: FnOnce(&CompiledFrame, Option<&mut Channel>) -> Result<A>,
    {
        for (source, obs) in inputs {
            if let Observation::Tensor {
                sizes,
                strides: Some(st),
            } = obs
            {
                if st.len() != sizes.len() {
                    return Err(Error::InvalidArgument(format!(
                        "source '{source}': {} strides for {} sizes",
                        st.len(),
                        sizes.len()
                    )));
                }
            }
        }
        let needs_channel = self.options.collectives || self.options.guard_collectives;
        if needs_channel && channel.is_none() {
            return Err(Error::InvalidArgument(
                "this cache exchanges (collectives or guard votes are on) but no channel was given"
                    .into(),
            ));
        }
        let call_no = self.calls;
        self.calls += 1;
        let config = self.options.config_text() + extra_config;
        let mut hit = self.lookup(inputs);
        if self.options.guard_collectives && !self.frames.is_empty() {
            if let Some(ch) = channel.as_deref_mut() {
                let mine = AnyVote(hit.is_none());
                let vote = ch.exchange_with(
                    &self.key,
                    &mine,
                    &crate::ExchangeOptions::default().with_config(&config),
                )?;
                if vote.any() {
                    hit = None;
                }
            }
        }
        if let Some(i) = hit {
            return Ok(Outcome::Hit(i));
        }
        if self.frames.len() >= self.options.recompile_limit as usize {
            return Ok(Outcome::Uncompiled);
        }
        // Preflight: this call's inputs, everything static, plus hints.
        let observed = FrameState::from_inputs(inputs);
        let mut local = observed.clone();
        local.join(&self.hints);
        let automatic = self.options.automatic_dynamic_shapes;
        if automatic {
            // The persisted state (a loaded profile, earlier compiles) is sent
            // too, so every rank ends with persisted ⊔ every rank's observations
            // even when ranks loaded different profiles (docs/protocol.md, One
            // exchange per frame compile). Folded, not joined, so that folding
            // what the ranks send gives the fold of their entries (module docs).
            local = fold_states(&self.state, [&local], true);
        }
        let mut fast_path = None;
        let before = self.state.clone();
        match (self.options.collectives, channel.as_deref_mut()) {
            (true, Some(ch)) => {
                let n = ch.world_size() as usize;
                let g = ch.exchange_with(
                    &self.key,
                    &local,
                    &crate::ExchangeOptions::default()
                        .with_config(&config)
                        // Overwriting needs every rank's state, in rank order.
                        .with_every_value(!automatic),
                )?;
                fast_path = Some(g.fast_path());
                let folded =
                    match g.per_rank() {
                        PerRank::Values(states)
                            if !automatic || states.iter().any(has_python_scalar) =>
                        {
                            Some(fold_states(&self.state, states.iter(), automatic))
                        }
                        PerRank::Same if !automatic || has_python_scalar(&local) => Some(
                            fold_states(&self.state, std::iter::repeat_n(&local, n), automatic),
                        ),
                        _ => None,
                    };
                match folded {
                    Some(state) => self.state = state,
                    None => self.state.join(g.merged()),
                }
            }
            _ => self.state = fold_states(&self.state, [&local], automatic),
        }
        if self.options.automatic_dynamic_exclusion_guard && automatic && !self.options.collectives
        {
            self.record_exclusions(&before, &observed);
        }
        let mut frame = self.build_frame(inputs);
        frame.fast_path = fast_path;
        let artifact = compile(&frame, channel)?;
        self.frames.push(frame);
        self.artifacts.push(artifact);
        self.compile_calls.push(call_no);
        Ok(Outcome::Compiled(self.frames.len() - 1))
    }

    /// Dynamo's `excluded_sizes` / `excluded_scalar` bookkeeping
    /// (`FrameStateSizeEntry.__ior__`, torch/_dynamo/pgo.py) for one
    /// compile without collectives: `before` is the state before it,
    /// `observed` this call's entries.
    fn record_exclusions(&mut self, before: &FrameState, observed: &FrameState) {
        for (source, seen) in observed.iter() {
            let old = before.get(source);
            let new = self.state.get(source);
            let ex = self.excluded.entry(source.to_owned()).or_default();
            if let Dims::Known(atoms) = &old.size {
                if new.size != old.size {
                    ex.sizes = Some(atoms.iter().map(|a| a.value().copied()).collect());
                } else {
                    ex.sizes = None;
                }
            }
            match (&old.scalar, &seen.scalar) {
                (Atom::Static(Scalar::Int(a)), Atom::Static(Scalar::Int(b))) if a != b => {
                    ex.scalar = Some(*a);
                }
                (Atom::Dynamic, _) => ex.scalar = None,
                _ => {}
            }
        }
    }

    /// The exclusion guard of an entry for `inputs`: the pairs of every
    /// realised size symbol and dynamic int with a recorded exclusion, unless
    /// the inputs hold every value (Dynamo then builds no guard).
    fn exclusions(&self, frame: &CompiledFrame, inputs: &Inputs) -> Vec<Exclusion> {
        let o = &self.options;
        if !(o.automatic_dynamic_exclusion_guard && o.automatic_dynamic_shapes && !o.collectives) {
            return Vec::new();
        }
        let mut pairs = Vec::new();
        for (source, guard) in &frame.guards {
            let Some(ex) = self.excluded.get(source) else {
                continue;
            };
            match guard {
                SourceGuard::Tensor { sizes, .. } => {
                    let Some(values) = ex.sizes.as_ref().filter(|v| v.len() == sizes.len()) else {
                        continue;
                    };
                    for (d, (g, v)) in sizes.iter().zip(values).enumerate() {
                        if let (DimGuard::Symbol(_), Some(v)) = (g, v) {
                            pairs.push(Exclusion {
                                source: source.clone(),
                                dim: Some(d),
                                value: i128::from(*v),
                            });
                        }
                    }
                }
                SourceGuard::Int(DimGuard::Free) => {
                    if let Some(v) = ex.scalar {
                        pairs.push(Exclusion {
                            source: source.clone(),
                            dim: None,
                            value: i128::from(v),
                        });
                    }
                }
                _ => {}
            }
        }
        if pairs.iter().all(|e| e.holds(inputs)) {
            return Vec::new();
        }
        pairs
    }

    fn build_frame(&self, inputs: &Inputs) -> CompiledFrame {
        let o = &self.options;
        let mut frame = CompiledFrame {
            index: u32::try_from(self.frames.len()).unwrap_or(u32::MAX),
            guards: BTreeMap::new(),
            decisions: BTreeMap::new(),
            dynamic_dims: BTreeMap::new(),
            dynamic_scalars: BTreeSet::new(),
            dynamic_strides: BTreeMap::new(),
            fast_path: None,
            exclusions: Vec::new(),
        };
        let mut next_symbol: u32 = 0;
        let mut size_symbols: HashMap<u64, u32> = HashMap::new();
        let zero_one = |v: i128| o.specialize_zero_one && (v == 0 || v == 1);
        for (source, obs) in inputs {
            // Without automatic dynamic only this rank's own hints make a size
            // or int dynamic (Dynamo gates those on the setting and reads
            // `mark_dynamic` off the tensor itself); a float reads the state
            // either way (`wrap_symfloat`), which, overwritten rather than
            // folded, then never holds a dynamic scalar.
            let entry = if o.automatic_dynamic_shapes || matches!(obs, Observation::Float(_)) {
                self.state.get(source)
            } else {
                self.hints.get(source)
            };
            let decision = decide(&entry, obs, o.overrides.get(source).copied());
            let guard = match (&decision, obs) {
                (SourceDecision::Float { dynamic }, Observation::Float(bits)) => {
                    if *dynamic {
                        frame.dynamic_scalars.insert(source.clone());
                        SourceGuard::Float(FloatGuard::Free)
                    } else {
                        SourceGuard::Float(FloatGuard::Static(*bits))
                    }
                }
                (SourceDecision::Bool, Observation::Bool(b)) => SourceGuard::Bool(*b),
                (SourceDecision::Int { dynamic }, Observation::Int(v)) => {
                    if *dynamic {
                        frame.dynamic_scalars.insert(source.clone());
                        SourceGuard::Int(DimGuard::Free)
                    } else {
                        SourceGuard::Int(DimGuard::Static(i128::from(*v)))
                    }
                }
                (
                    SourceDecision::Tensor {
                        dynamic_sizes,
                        dynamic_strides,
                    },
                    Observation::Tensor { sizes, .. },
                ) => {
                    let strides = obs.strides().unwrap_or_default();
                    let canon = canonical_strides(sizes, &strides);
                    let mut dims = Vec::new();
                    let mut size_guards = Vec::with_capacity(sizes.len());
                    for (i, (&v, &dynamic)) in sizes.iter().zip(dynamic_sizes).enumerate() {
                        if dynamic && !zero_one(i128::from(v)) {
                            dims.push(i);
                            let sym = if o.duck_sizing {
                                *size_symbols.entry(v).or_insert_with(|| {
                                    next_symbol += 1;
                                    next_symbol - 1
                                })
                            } else {
                                next_symbol += 1;
                                next_symbol - 1
                            };
                            size_guards.push(DimGuard::Symbol(sym));
                        } else {
                            size_guards.push(DimGuard::Static(i128::from(v)));
                        }
                    }
                    let mut stride_dims = Vec::new();
                    let mut stride_guards = Vec::with_capacity(sizes.len());
                    for (i, (&dynamic, c)) in dynamic_strides.iter().zip(&canon).enumerate() {
                        if dynamic && !zero_one(i128::from(strides[i])) {
                            stride_dims.push(i);
                            stride_guards.push(None);
                        } else {
                            stride_guards.push(Some(*c));
                        }
                    }
                    if !dims.is_empty() {
                        frame.dynamic_dims.insert(source.clone(), dims);
                    } else if !stride_dims.is_empty() {
                        frame.dynamic_strides.insert(source.clone(), stride_dims);
                    }
                    SourceGuard::Tensor {
                        sizes: size_guards,
                        strides: stride_guards,
                    }
                }
                _ => SourceGuard::None,
            };
            frame.guards.insert(source.clone(), guard);
            frame.decisions.insert(source.clone(), decision);
        }
        frame.exclusions = self.exclusions(&frame, inputs);
        frame
    }
}

/// Dynamo's `excluded_sizes` / `excluded_scalar` of one source.
#[derive(Clone, Debug, Default)]
struct Excluded {
    sizes: Option<Vec<Option<u64>>>,
    scalar: Option<i64>,
}

/// Whether a state holds a float or bool scalar, where Python's `==` (the
/// fold) and the join part ways ([`Scalar::is_python_ambiguous`]).
fn has_python_scalar(state: &FrameState) -> bool {
    state
        .iter()
        .any(|(_, e)| e.scalar.value().is_some_and(Scalar::is_python_ambiguous))
}

/// `base` with each of `states` folded in, in order: per source,
/// [`SizeEntry::fold`] (`automatic`), or the state's entry replacing the
/// one there (automatic dynamic off: Dynamo's `update_automatic_dynamic`
/// overwrites).
fn fold_states<'a>(
    base: &FrameState,
    states: impl IntoIterator<Item = &'a FrameState>,
    automatic: bool,
) -> FrameState {
    let mut out = base.clone();
    for state in states {
        for (source, entry) in state.iter() {
            let new = if automatic {
                let mut e: SizeEntry = out.get(source);
                e.fold(&entry);
                e
            } else {
                entry
            };
            out.insert(source, &new);
        }
    }
    out
}
