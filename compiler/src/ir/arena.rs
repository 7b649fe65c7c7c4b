//! Typed arena with `Handle<T>` indices and a parallel span vector (as naga does).

use cvc_grammar::Span;
use std::fmt;
use std::marker::PhantomData;
use std::num::NonZeroU32;

/// Index of an item in an [`Arena<T>`]. A non-zero `u32`, so `Option<Handle<T>>` is free.
pub struct Handle<T> {
    index: NonZeroU32,
    _marker: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// The handle of the `index`-th item (0-based).
    pub fn from_index(index: usize) -> Self {
        let raw = u32::try_from(index + 1).expect("arena overflow");
        Handle { index: NonZeroU32::new(raw).expect("non-zero"), _marker: PhantomData }
    }

    /// 0-based position in the arena.
    pub fn index(self) -> usize {
        self.index.get() as usize - 1
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index
    }
}
impl<T> Eq for Handle<T> {}
impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Handle<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.index.cmp(&other.index)
    }
}
impl<T> std::hash::Hash for Handle<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.index.hash(state)
    }
}
impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.index())
    }
}
impl<T> fmt::Display for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "%{}", self.index())
    }
}
impl<T> serde::Serialize for Handle<T> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u32(self.index() as u32)
    }
}

/// Append-only storage of `T` with a source span per item.
#[derive(Clone, Debug)]
pub struct Arena<T> {
    items: Vec<T>,
    spans: Vec<Span>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { items: Vec::new(), spans: Vec::new() }
    }
}

impl<T> Arena<T> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds `item` made by the source text at `span`.
    pub fn append(&mut self, item: T, span: Span) -> Handle<T> {
        self.items.push(item);
        self.spans.push(span);
        Handle::from_index(self.items.len() - 1)
    }
    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }
    /// Whether the arena holds nothing.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
    /// The span of the item `h`.
    pub fn span(&self, h: Handle<T>) -> Span {
        self.spans[h.index()]
    }
    /// All handles, in insertion order.
    pub fn handles(&self) -> impl DoubleEndedIterator<Item = Handle<T>> + ExactSizeIterator {
        (0..self.items.len()).map(Handle::from_index)
    }
    /// All `(handle, item)` pairs in insertion order.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (Handle<T>, &T)> {
        self.items.iter().enumerate().map(|(i, t)| (Handle::from_index(i), t))
    }
}

impl<T> std::ops::Index<Handle<T>> for Arena<T> {
    type Output = T;
    fn index(&self, h: Handle<T>) -> &T {
        &self.items[h.index()]
    }
}
impl<T> std::ops::IndexMut<Handle<T>> for Arena<T> {
    fn index_mut(&mut self, h: Handle<T>) -> &mut T {
        &mut self.items[h.index()]
    }
}
