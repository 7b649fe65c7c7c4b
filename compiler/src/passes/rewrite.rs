//! Graph rebuilding for passes that insert, replace or drop nodes: the arena is append-only,
//! so a rewriting pass copies the graph node by node into a fresh one, remapping handles
//! through a [`ValueMap`].

use crate::ir::builder::infer;
use crate::ir::*;
use cvc_grammar::Span;

/// Where each value of a graph went when the graph was rewritten: old handle → new handle, or
/// nothing for a value the rewrite removed. Looking up a removed value is an error
/// ([`ValueMap::get`]), never the old handle: an old handle names some other node of the new
/// graph.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueMap {
    to: Vec<Option<Value>>,
}

impl ValueMap {
    /// A map from a graph of `len` values with no value mapped yet.
    pub fn empty(len: usize) -> Self {
        ValueMap { to: vec![None; len] }
    }

    /// The map of a rewrite that changed nothing (every value maps to itself).
    pub fn identity(g: &Graph) -> Self {
        ValueMap { to: g.nodes.handles().map(Some).collect() }
    }

    /// The new value of old value `v`, if it still exists.
    pub fn lookup(&self, v: Value) -> Option<Value> {
        self.to.get(v.index()).copied().flatten()
    }

    /// The new value of old value `v`; an internal error when the rewrite removed it (or it is
    /// not a value of the old graph).
    pub fn get(&self, v: Value) -> Result<Value, String> {
        self.lookup(v).ok_or_else(|| format!("value {v} has no counterpart in the rewritten graph"))
    }

    /// Records that old value `old` is now `new`.
    pub fn set(&mut self, old: Value, new: Value) {
        self.to[old.index()] = Some(new);
    }

    /// The map of this rewrite followed by `next` (a value removed by either is removed).
    pub fn then(&self, next: &ValueMap) -> ValueMap {
        ValueMap { to: self.to.iter().map(|m| m.and_then(|v| next.lookup(v))).collect() }
    }

    /// How many old values the map covers.
    pub fn len(&self) -> usize {
        self.to.len()
    }

    /// Whether the old graph had no values.
    pub fn is_empty(&self) -> bool {
        self.to.is_empty()
    }
}

/// Copies an old graph into a new one, remapping every operand through `map`.
pub struct Rewriter<'a> {
    /// The graph being rewritten.
    pub old: &'a Graph,
    /// The graph being built.
    pub new: Graph,
    /// The new value standing for each old value, once emitted.
    pub map: ValueMap,
}

impl<'a> Rewriter<'a> {
    /// A rewriter with an empty new graph of the same name and mode.
    pub fn new(old: &'a Graph) -> Self {
        Rewriter { old, new: Graph::new(&old.name, old.mode), map: ValueMap::empty(old.nodes.len()) }
    }

    /// The new value of old value `v`; an internal error when `v` has not been emitted (passes
    /// emit operands before their users).
    pub fn mapped(&self, v: Value) -> Result<Value, String> {
        self.map.get(v)
    }

    /// Appends a node to the new graph.
    pub fn push(&mut self, node: Node, span: Span) -> Value {
        self.new.nodes.append(node, span)
    }

    /// Appends `op(inputs)` (new values) with an inferred type, taking span and origin from
    /// old value `like`. `shape` is the target shape for reshape/expand/dropout masks.
    pub fn emit(
        &mut self,
        op: Op,
        inputs: Vec<Value>,
        like: Value,
        shape: Option<&Shape>,
    ) -> Result<Value, String> {
        let tys: Vec<&TensorType> = inputs.iter().map(|&i| self.new.ty(i)).collect();
        let ty = match (&op, shape) {
            (o, Some(s)) if o.is_leaf() => TensorType::new(self.old.ty(like).dtype, s.clone()),
            _ => infer(&op, &tys, shape)?,
        };
        let origin = self.old.node(like).origin.clone();
        let span = self.old.span(like);
        Ok(self.push(Node { op, inputs, ty, origin }, span))
    }

    /// Copies old node `v` with its operands remapped, and records the mapping.
    pub fn copy(&mut self, v: Value) -> Result<Value, String> {
        let n = self.old.node(v);
        let inputs = n.inputs.iter().map(|&i| self.mapped(i)).collect::<Result<_, _>>()?;
        let node = Node { op: n.op.clone(), inputs, ty: n.ty.clone(), origin: n.origin.clone() };
        let nv = self.push(node, self.old.span(v));
        self.map.set(v, nv);
        Ok(nv)
    }

    /// Finishes: outputs and loss are remapped. Returns the new graph and the old→new map.
    pub fn finish(mut self) -> Result<(Graph, ValueMap), String> {
        for o in &self.old.outputs {
            let value = self.map.get(o.value).map_err(|e| format!("output `{}`: {e}", o.name))?;
            self.new.outputs.push(Output { name: o.name.clone(), value });
        }
        self.new.loss = match self.old.loss {
            Some(l) => Some(self.map.get(l).map_err(|e| format!("the loss: {e}"))?),
            None => None,
        };
        Ok((self.new, self.map))
    }
}

/// Which values are needed: reachable from outputs, the loss, assigns, the values in `keep`
/// (parameter gradients, which the runtime reads back after a step even when no update
/// reads them), or persistent and input leaves (which the runtime binds by name and therefore
/// always keep).
pub fn live_nodes(g: &Graph, keep: &[Value]) -> Vec<bool> {
    let mut live = vec![false; g.nodes.len()];
    let mut stack: Vec<Value> = g.outputs.iter().map(|o| o.value).collect();
    stack.extend(g.loss);
    stack.extend(keep.iter().copied());
    for (h, n) in g.nodes.iter() {
        if matches!(n.op, Op::Assign | Op::Input { .. }) || n.op.is_persistent() {
            stack.push(h);
        }
    }
    while let Some(v) = stack.pop() {
        if live[v.index()] {
            continue;
        }
        live[v.index()] = true;
        stack.extend(g.node(v).inputs.iter().copied());
    }
    live
}

/// Removes nodes nothing needs (see [`live_nodes`]; `keep` are extra roots), keeping the
/// order of the rest. Returns the new graph and the old→new value map (removed nodes have
/// no image).
pub fn eliminate_dead(g: &Graph, keep: &[Value]) -> Result<(Graph, ValueMap), String> {
    let live = live_nodes(g, keep);
    if live.iter().all(|&l| l) {
        return Ok((g.clone(), ValueMap::identity(g)));
    }
    let mut rw = Rewriter::new(g);
    for v in g.nodes.handles() {
        if live[v.index()] {
            rw.copy(v)?;
        }
    }
    rw.finish()
}
