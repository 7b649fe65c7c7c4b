//! Argument checking for layer calls: positional/keyword binding, types, ranges, suggestions.

use super::{Arg, ArgValue, LayerCall};
use crate::diag::Diagnostic;
use cvc_grammar::Span;

/// The largest integer a layer argument (channels, kernel, stride, ...) may take; keeps every
/// derived extent and fan far from overflow.
pub(crate) const MAX_COUNT: i64 = 1 << 24;

/// The non-tensor arguments of one call, bound to the operator's parameter names.
pub(crate) struct Args<'c> {
    op: &'c str,
    signature: &'static str,
    call_span: Span,
    names: &'static [&'static str],
    slots: Vec<Option<&'c Arg>>,
    /// Positional arguments beyond the named slots (variadic ops such as `reshape`).
    pub(crate) rest: Vec<&'c Arg>,
}

/// "Did you mean" suggestions: the front end's one implementation.
pub(crate) use crate::front::resolve::did_you_mean as suggest;

/// Human name of an argument value's type, for "wrong type" errors.
pub(crate) fn kind_name(v: &ArgValue) -> &'static str {
    match v {
        ArgValue::Int(_) => "an integer",
        ArgValue::Float(_) => "a number",
        ArgValue::Bool(_) => "a boolean",
        ArgValue::Ident(_) => "a name",
        ArgValue::Str(_) => "a string",
        ArgValue::Range(..) => "a range",
        ArgValue::Tuple(_) => "a tuple",
        ArgValue::Numbers(_) => "a tuple of numbers",
    }
}

impl<'c> Args<'c> {
    /// Binds `call.args` to `names` (positional arguments fill `names` in order unless
    /// `variadic`, in which case they all go to [`Args::rest`]).
    pub(crate) fn parse(
        call: &'c LayerCall<'c>,
        signature: &'static str,
        names: &'static [&'static str],
        variadic: bool,
    ) -> Result<Self, Diagnostic> {
        let mut a = Args {
            op: call.op,
            signature,
            call_span: call.span,
            names,
            slots: vec![None; names.len()],
            rest: Vec::new(),
        };
        let mut next_pos = 0;
        for arg in call.args {
            let slot = match &arg.name {
                Some(n) => match names.iter().position(|x| x == n) {
                    Some(i) => i,
                    None => return Err(a.unknown(arg, n)),
                },
                None if variadic => {
                    a.rest.push(arg);
                    continue;
                }
                None => {
                    while next_pos < names.len() && a.slots[next_pos].is_some() {
                        next_pos += 1;
                    }
                    if next_pos >= names.len() {
                        return Err(Diagnostic::error(
                            format!("too many arguments for `{}`", a.op),
                            arg.span,
                            "unexpected argument",
                        )
                        .with_help(format!("the signature is `{}`", a.signature)));
                    }
                    next_pos
                }
            };
            if let Some(prev) = a.slots[slot] {
                return Err(Diagnostic::error(
                    format!("argument `{}` of `{}` given twice", names[slot], a.op),
                    arg.span,
                    "given again here",
                )
                .with_label(prev.span, "first given here"));
            }
            a.slots[slot] = Some(arg);
        }
        Ok(a)
    }

    fn unknown(&self, arg: &Arg, name: &str) -> Diagnostic {
        let accepted = if self.names.is_empty() {
            format!("`{}` takes no named arguments", self.op)
        } else {
            format!("accepted arguments: {}", self.names.join(", "))
        };
        let mut d = Diagnostic::error(
            format!("unknown argument `{name}` for `{}`", self.op),
            arg.span,
            format!("`{}` has no argument `{name}`", self.op),
        );
        d = match suggest(name, self.names.iter().copied()) {
            Some(s) => d.with_help(format!("did you mean `{s}`? {accepted}")),
            None => d.with_help(accepted),
        };
        d.with_note(format!("the signature is `{}`", self.signature))
    }

    /// The argument bound to `name`, if given.
    pub(crate) fn get(&self, name: &str) -> Option<&'c Arg> {
        let i = self.names.iter().position(|x| *x == name).expect("argument name in the table");
        self.slots[i]
    }

    /// An error about the value of argument `arg`.
    pub(crate) fn bad(&self, arg: &Arg, message: String, label: impl Into<String>) -> Diagnostic {
        Diagnostic::error(message, arg.span, label)
            .with_note(format!("the signature is `{}`", self.signature))
    }

    fn wrong_type(&self, arg: &Arg, name: &str, want: &str) -> Diagnostic {
        self.bad(
            arg,
            format!("argument `{name}` of `{}` must be {want}", self.op),
            format!("this is {}", kind_name(&arg.value)),
        )
    }

    /// A required argument that was not given.
    pub(crate) fn missing(&self, name: &str) -> Diagnostic {
        Diagnostic::error(
            format!("`{}` is missing its required argument `{name}`", self.op),
            self.call_span,
            format!("`{name}` not given"),
        )
        .with_help(format!("the signature is `{}`", self.signature))
    }

    /// An integer argument (any sign), or `None` when absent.
    pub(crate) fn int_opt(&self, name: &str) -> Result<Option<(i64, Span)>, Diagnostic> {
        match self.get(name) {
            None => Ok(None),
            Some(arg) => match arg.value {
                ArgValue::Int(v) => Ok(Some((v, arg.span))),
                _ => Err(self.wrong_type(arg, name, "an integer")),
            },
        }
    }

    /// An integer argument that must be `>= min`, with a default when absent (`None`: required).
    pub(crate) fn count(&self, name: &str, default: Option<usize>, min: usize) -> Result<usize, Diagnostic> {
        match self.int_opt(name)? {
            None => default.ok_or_else(|| self.missing(name)),
            Some((v, _)) => self.check_count(self.get(name).expect("given"), name, v, min),
        }
    }

    fn check_count(&self, arg: &Arg, name: &str, v: i64, min: usize) -> Result<usize, Diagnostic> {
        if v < min as i64 {
            let want = if min == 0 { "zero or more".to_string() } else { format!("at least {min}") };
            return Err(self.bad(
                arg,
                format!("argument `{name}` of `{}` must be {want}, got {v}", self.op),
                "out of range",
            ));
        }
        if v > MAX_COUNT {
            return Err(self.bad(
                arg,
                format!("argument `{name}` of `{}` is too large ({v} > {MAX_COUNT})", self.op),
                "too large",
            ));
        }
        Ok(v as usize)
    }

    /// An integer or a 2-tuple (`kernel = 3` or `kernel = (3, 5)`), each `>= min`.
    pub(crate) fn pair(
        &self,
        name: &str,
        default: Option<usize>,
        min: usize,
    ) -> Result<[usize; 2], Diagnostic> {
        let Some(arg) = self.get(name) else {
            let d = default.ok_or_else(|| self.missing(name))?;
            return Ok([d, d]);
        };
        match &arg.value {
            ArgValue::Int(v) => {
                let v = self.check_count(arg, name, *v, min)?;
                Ok([v, v])
            }
            ArgValue::Tuple(t) if t.len() == 2 => {
                Ok([self.check_count(arg, name, t[0], min)?, self.check_count(arg, name, t[1], min)?])
            }
            ArgValue::Tuple(t) => Err(self.bad(
                arg,
                format!("argument `{name}` of `{}` takes 2 values (height, width), got {}", self.op, t.len()),
                "wrong number of values",
            )),
            _ => Err(self.wrong_type(arg, name, "an integer or a pair `(h, w)`")),
        }
    }

    /// An integer or a 3-tuple (`kernel = 3` or `kernel = (3, 5, 5)`), each `>= min`: the
    /// per-axis `(depth, height, width)` arguments of the volume layers.
    pub(crate) fn triple(
        &self,
        name: &str,
        default: Option<usize>,
        min: usize,
    ) -> Result<[usize; 3], Diagnostic> {
        let Some(arg) = self.get(name) else {
            let d = default.ok_or_else(|| self.missing(name))?;
            return Ok([d, d, d]);
        };
        match &arg.value {
            ArgValue::Int(v) => {
                let v = self.check_count(arg, name, *v, min)?;
                Ok([v, v, v])
            }
            ArgValue::Tuple(t) if t.len() == 3 => Ok([
                self.check_count(arg, name, t[0], min)?,
                self.check_count(arg, name, t[1], min)?,
                self.check_count(arg, name, t[2], min)?,
            ]),
            ArgValue::Tuple(t) => Err(self.bad(
                arg,
                format!(
                    "argument `{name}` of `{}` takes 3 values (depth, height, width), got {}",
                    self.op,
                    t.len()
                ),
                "wrong number of values",
            )),
            _ => Err(self.wrong_type(arg, name, "an integer or a triple `(d, h, w)`")),
        }
    }

    /// A tuple of finite numbers (`weight = (1.0, 0.5, 2)`; one value may be written bare),
    /// each `>= min`, or `None` when absent.
    pub(crate) fn numbers(&self, name: &str, min: f64) -> Result<Option<(Vec<f64>, Span)>, Diagnostic> {
        let Some(arg) = self.get(name) else { return Ok(None) };
        let vals: Vec<f64> = match &arg.value {
            ArgValue::Tuple(t) => t.iter().map(|&v| v as f64).collect(),
            ArgValue::Numbers(t) => t.clone(),
            ArgValue::Int(v) => vec![*v as f64],
            ArgValue::Float(v) => vec![*v],
            _ => return Err(self.wrong_type(arg, name, "a tuple of numbers `(1.0, 0.5, ...)`")),
        };
        if let Some(bad) = vals.iter().find(|v| !v.is_finite() || **v < min) {
            return Err(self.bad(
                arg,
                format!("argument `{name}` of `{}` must hold finite numbers >= {min}, got {bad}", self.op),
                "out of range",
            ));
        }
        Ok(Some((vals, arg.span)))
    }

    /// A number (integers accepted) with a default.
    pub(crate) fn float(&self, name: &str, default: f64) -> Result<f64, Diagnostic> {
        match self.get(name) {
            None => Ok(default),
            Some(arg) => match arg.value {
                ArgValue::Float(v) if v.is_finite() => Ok(v),
                ArgValue::Int(v) => Ok(v as f64),
                _ => Err(self.wrong_type(arg, name, "a finite number")),
            },
        }
    }

    /// A number that must lie in `lo..hi` (`lo` included, `hi` excluded unless `hi_incl`).
    pub(crate) fn float_in(
        &self,
        name: &str,
        default: f64,
        lo: f64,
        hi: f64,
        hi_incl: bool,
    ) -> Result<f64, Diagnostic> {
        let v = self.float(name, default)?;
        let ok = v >= lo && (v < hi || (hi_incl && v == hi));
        if !ok {
            let arg = self.get(name).expect("defaults are in range");
            let close = if hi_incl { "]" } else { ")" };
            return Err(self.bad(
                arg,
                format!("argument `{name}` of `{}` must be in [{lo}, {hi}{close}, got {v}", self.op),
                "out of range",
            ));
        }
        Ok(v)
    }

    /// A strictly positive number.
    pub(crate) fn positive(&self, name: &str, default: f64) -> Result<f64, Diagnostic> {
        let v = self.float(name, default)?;
        if v <= 0.0 {
            let arg = self.get(name).expect("defaults are positive");
            return Err(self.bad(
                arg,
                format!("argument `{name}` of `{}` must be positive, got {v}", self.op),
                "out of range",
            ));
        }
        Ok(v)
    }

    /// A boolean with a default.
    pub(crate) fn flag(&self, name: &str, default: bool) -> Result<bool, Diagnostic> {
        match self.get(name) {
            None => Ok(default),
            Some(arg) => match arg.value {
                ArgValue::Bool(v) => Ok(v),
                _ => Err(self.wrong_type(arg, name, "`true` or `false`")),
            },
        }
    }

    /// A word from `choices` (bare or quoted), with a default.
    pub(crate) fn choice(
        &self,
        name: &str,
        default: &'static str,
        choices: &[&'static str],
    ) -> Result<&'static str, Diagnostic> {
        let Some(arg) = self.get(name) else { return Ok(default) };
        let word = match &arg.value {
            ArgValue::Ident(w) | ArgValue::Str(w) => w.as_str(),
            _ => return Err(self.wrong_type(arg, name, &format!("one of {}", choices.join(", ")))),
        };
        if let Some(c) = choices.iter().find(|c| **c == word) {
            return Ok(c);
        }
        let mut d = self.bad(
            arg,
            format!("`{word}` is not a valid `{name}` for `{}`", self.op),
            format!("expected one of {}", choices.join(", ")),
        );
        if let Some(s) = suggest(word, choices.iter().copied()) {
            d = d.with_help(format!("did you mean `{s}`?"));
        }
        Err(d)
    }

    /// An axis argument (negative counts from the end) resolved against `rank`.
    pub(crate) fn axis(&self, name: &str, default: i64, rank: usize) -> Result<usize, Diagnostic> {
        let (v, span) = match self.int_opt(name)? {
            Some(x) => x,
            None => (default, self.call_span),
        };
        resolve_axis(v, rank).ok_or_else(|| {
            Diagnostic::error(
                format!("axis {v} is out of range for a tensor of rank {rank}"),
                span,
                format!("valid axes are {} to {}", -(rank as i64), rank as i64 - 1),
            )
        })
    }

    /// The call's positional arguments beyond the named ones, as integers; `B` counts as
    /// `None` when `allow_batch` (reshape targets).
    pub(crate) fn rest_ints(&self, allow_batch: bool) -> Result<Vec<(Option<i64>, Span)>, Diagnostic> {
        let mut out = Vec::new();
        for arg in &self.rest {
            match &arg.value {
                ArgValue::Int(v) => out.push((Some(*v), arg.span)),
                ArgValue::Tuple(t) => out.extend(t.iter().map(|&v| (Some(v), arg.span))),
                ArgValue::Ident(w) if allow_batch && w == "B" => out.push((None, arg.span)),
                _ => {
                    let want = if allow_batch { "integers or `B`" } else { "integers" };
                    return Err(self.bad(
                        arg,
                        format!("the positional arguments of `{}` must be {want}", self.op),
                        format!("this is {}", kind_name(&arg.value)),
                    ));
                }
            }
        }
        Ok(out)
    }
}

/// `axis` (negative counts from the end) as an index into `rank` axes.
pub(crate) fn resolve_axis(axis: i64, rank: usize) -> Option<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}
