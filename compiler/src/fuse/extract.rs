//! DAG-aware extraction. Tree cost counts a node shared by q, k and v three times; here a
//! choice of one node per e-class is priced as a whole: the union of the classes reachable from
//! the roots, each paid once, plus one barrier per dependency level.
//!
//! 1. **Greedy over sub-DAGs**: every class takes the node whose own cost plus the union of its
//!    children's reachable classes, plus a barrier per dispatch on its longest chain, is least,
//!    iterated to a fixpoint (no node whose sub-DAG reaches its own class). The chain's term
//!    lets a form that is one level shorter win where the nodes cost alike (the routed experts'
//!    sum adding the shared expert, whose gate/up then takes its norm as a prologue), which no
//!    single move of step 2 would reach.
//! 2. **Local search** on the whole price: switch one class to another node, or switch every
//!    class that can read a shared class to its node that does (the move that packs q, k and v
//!    into one kernel at once); keep a move only if the price drops. Repeat to a fixpoint.

use super::cost::{node_bytes, node_cost, Cost, DeviceCost};
use super::lang::{FuseGraph, FuseLang};
use egg::{Id, Language};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// One node per class (canonical ids); `reachable` are the classes the roots use.
#[derive(Clone, Debug)]
pub struct Extraction {
    pub choice: BTreeMap<Id, FuseLang>,
    pub reachable: BTreeSet<Id>,
    pub roots: Vec<Id>,
    pub cost: Cost,
    /// Local-search moves kept (for reports).
    pub moves: usize,
}

impl Extraction {
    /// The chosen node of class `c` (canonical or not).
    pub fn node(&self, g: &FuseGraph, c: Id) -> &FuseLang {
        &self.choice[&g.find(c)]
    }
}

struct Ctx<'a> {
    g: &'a FuseGraph,
    dev: &'a DeviceCost,
    roots: Vec<Id>,
}

impl Ctx<'_> {
    fn canon(&self, n: &FuseLang) -> FuseLang {
        let mut n = n.clone();
        n.update_children(|c| self.g.find(c));
        n
    }

    /// The price of `choice` from the roots, or None when it is cyclic or incomplete.
    fn price(&self, choice: &BTreeMap<Id, FuseLang>) -> Option<Cost> {
        // 0 = unseen, 1 = on the stack, 2 = done; depth = dispatches on the longest chain.
        let mut state: HashMap<Id, (u8, usize)> = HashMap::new();
        let mut cost = Cost::default();
        let mut us = 0.0;
        fn visit(
            ctx: &Ctx<'_>,
            choice: &BTreeMap<Id, FuseLang>,
            c: Id,
            state: &mut HashMap<Id, (u8, usize)>,
            cost: &mut Cost,
            us: &mut f64,
        ) -> Option<usize> {
            match state.get(&c) {
                Some((1, _)) => return None,
                Some((_, d)) => return Some(*d),
                None => {}
            }
            state.insert(c, (1, 0));
            let n = choice.get(&c)?;
            let mut depth = 0;
            for &ch in n.children() {
                depth = depth.max(visit(ctx, choice, ch, state, cost, us)?);
            }
            if n.is_kernel() {
                depth += 1;
                cost.dispatches += 1;
                cost.bytes += node_bytes(ctx.g, c, n, ctx.dev);
                *us += node_cost(ctx.g, c, n, ctx.dev);
            }
            state.insert(c, (2, depth));
            Some(depth)
        }
        let mut levels = 0;
        for &r in &self.roots {
            levels = levels.max(visit(self, choice, r, &mut state, &mut cost, &mut us)?);
        }
        cost.levels = levels;
        cost.us = us + levels as f64 * self.dev.barrier_us;
        Some(cost)
    }

    fn reachable(&self, choice: &BTreeMap<Id, FuseLang>) -> BTreeSet<Id> {
        let mut seen = BTreeSet::new();
        let mut stack = self.roots.clone();
        while let Some(c) = stack.pop() {
            if seen.insert(c) {
                if let Some(n) = choice.get(&c) {
                    stack.extend(n.children().iter().copied());
                }
            }
        }
        seen
    }
}

/// Extracts a cheapest-found choice for `roots` of `g` (rebuilt) under `dev`'s prices.
pub fn extract(g: &FuseGraph, roots: &[Id], dev: &DeviceCost) -> Extraction {
    let ctx = Ctx {
        g,
        dev,
        roots: roots.iter().map(|&r| g.find(r)).collect(),
    };
    let classes: Vec<Id> = {
        let mut v: Vec<Id> = g.classes().map(|c| c.id).collect();
        v.sort();
        v
    };

    // 1. Greedy over sub-DAGs: a class's set maps every class its sub-DAG reaches to the
    // cost of that class's chosen node.
    let mut choice: BTreeMap<Id, FuseLang> = BTreeMap::new();
    let mut sets: HashMap<Id, BTreeMap<Id, f64>> = HashMap::new();
    // A class's chosen price: its sub-DAG's cost and its longest chain of dispatches.
    let mut totals: HashMap<Id, (f64, usize)> = HashMap::new();
    let key = |(cost, depth): (f64, usize)| cost + depth as f64 * dev.barrier_us;
    for _ in 0..100 {
        let mut changed = false;
        for &c in &classes {
            for n in &g[c].nodes {
                let n = ctx.canon(n);
                let mut set: BTreeMap<Id, f64> = BTreeMap::new();
                let mut depth = 0;
                let mut ok = true;
                for ch in n.children() {
                    match sets.get(ch) {
                        Some(s) if !s.contains_key(&c) => {
                            set.extend(s.iter().map(|(k, v)| (*k, *v)));
                            depth = depth.max(totals[ch].1);
                        }
                        _ => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    continue;
                }
                set.insert(c, node_cost(g, c, &n, dev));
                let total = (set.values().sum(), depth + usize::from(n.is_kernel()));
                let better = match totals.get(&c) {
                    None => true,
                    Some(&t) => key(total) < key(t) - 1e-9,
                };
                if better {
                    totals.insert(c, total);
                    sets.insert(c, set);
                    choice.insert(c, n);
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }

    // 2. Local search on the whole price.
    let mut best = ctx.price(&choice).unwrap_or(Cost {
        us: f64::INFINITY,
        ..Cost::default()
    });
    let mut moves = 0;
    for _ in 0..50 {
        let mut improved = false;
        // Group moves: every reachable class that has a node reading `s` switches to it.
        for &s in &classes {
            let reach = ctx.reachable(&choice);
            let mut trial = choice.clone();
            let mut any = false;
            for &c in &reach {
                if c == s {
                    continue;
                }
                if let Some(n) = g[c]
                    .nodes
                    .iter()
                    .map(|n| ctx.canon(n))
                    .find(|n| n.children().contains(&s))
                {
                    if trial.get(&c) != Some(&n) {
                        trial.insert(c, n);
                        any = true;
                    }
                }
            }
            if any {
                if let Some(p) = ctx.price(&trial) {
                    if p.us < best.us - 1e-9 {
                        best = p;
                        choice = trial;
                        moves += 1;
                        improved = true;
                    }
                }
            }
        }
        // Single moves.
        for c in ctx.reachable(&choice) {
            for n in &g[c].nodes {
                let n = ctx.canon(n);
                if choice.get(&c) == Some(&n) {
                    continue;
                }
                let mut trial = choice.clone();
                trial.insert(c, n);
                if let Some(p) = ctx.price(&trial) {
                    if p.us < best.us - 1e-9 {
                        best = p;
                        choice = trial;
                        moves += 1;
                        improved = true;
                    }
                }
            }
        }
        if !improved {
            break;
        }
    }
    let reachable = ctx.reachable(&choice);
    Extraction {
        choice,
        reachable,
        roots: ctx.roots,
        cost: best,
        moves,
    }
}

/// The price of `choice` from `roots` (None when it is cyclic or incomplete).
pub fn price(
    g: &FuseGraph,
    roots: &[Id],
    choice: &BTreeMap<Id, FuseLang>,
    dev: &DeviceCost,
) -> Option<Cost> {
    let ctx = Ctx {
        g,
        dev,
        roots: roots.iter().map(|&r| g.find(r)).collect(),
    };
    ctx.price(choice)
}
