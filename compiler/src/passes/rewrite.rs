//! Graph rebuilding for passes that insert, replace or drop nodes: the arena is append-only,
//! so a rewriting pass copies the graph node by node into a fresh one, remapping handles.

use crate::ir::builder::infer;
use crate::ir::*;
use cvc_grammar::Span;

/// Copies an old graph into a new one, remapping every operand through `map`.
pub struct Rewriter<'a> {
    /// The graph being rewritten.
    pub old: &'a Graph,
    /// The graph being built.
    pub new: Graph,
    /// The new value standing for each old value (by old index), once emitted.
    pub map: Vec<Option<Value>>,
}

impl<'a> Rewriter<'a> {
    /// A rewriter with an empty new graph of the same name and mode.
    pub fn new(old: &'a Graph) -> Self {
        Rewriter { old, new: Graph::new(&old.name, old.mode), map: vec![None; old.nodes.len()] }
    }

    /// The new value of old value `v`.
    ///
    /// # Panics
    /// When `v` has not been emitted yet (passes emit operands before users).
    pub fn mapped(&self, v: Value) -> Value {
        self.map[v.index()].expect("operand emitted before its user")
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
    pub fn copy(&mut self, v: Value) -> Value {
        let n = self.old.node(v);
        let inputs = n.inputs.iter().map(|&i| self.mapped(i)).collect();
        let node = Node { op: n.op.clone(), inputs, ty: n.ty.clone(), origin: n.origin.clone() };
        let nv = self.push(node, self.old.span(v));
        self.map[v.index()] = Some(nv);
        nv
    }

    /// Finishes: outputs and loss are remapped.
    pub fn finish(mut self) -> Graph {
        for o in &self.old.outputs {
            let value = self.map[o.value.index()].expect("output emitted");
            self.new.outputs.push(Output { name: o.name.clone(), value });
        }
        self.new.loss = self.old.loss.map(|l| self.map[l.index()].expect("loss emitted"));
        self.new
    }
}

/// Which values are needed: reachable from outputs, the loss, assigns, or persistent and
/// input leaves (which the runtime binds by name and therefore always keep).
pub fn live_nodes(g: &Graph) -> Vec<bool> {
    let mut live = vec![false; g.nodes.len()];
    let mut stack: Vec<Value> = g.outputs.iter().map(|o| o.value).collect();
    stack.extend(g.loss);
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

/// Removes nodes nothing needs (see [`live_nodes`]), keeping the order of the rest.
pub fn eliminate_dead(g: &Graph) -> Graph {
    eliminate_dead_mapped(g).0
}

/// Like [`eliminate_dead`], also returning the old→new value map (`None` for removed nodes).
pub fn eliminate_dead_mapped(g: &Graph) -> (Graph, Vec<Option<Value>>) {
    let live = live_nodes(g);
    if live.iter().all(|&l| l) {
        return (g.clone(), g.nodes.handles().map(Some).collect());
    }
    let mut rw = Rewriter::new(g);
    for v in g.nodes.handles() {
        if live[v.index()] {
            rw.copy(v);
        }
    }
    let map = rw.map.clone();
    (rw.finish(), map)
}
