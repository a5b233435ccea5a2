//! Shell lines as a shell will run them. The local policy judges commands,
//! not text: `s''u`, `\su` and `$'s\x75'` all run `su`, and `$(su)` inside
//! an argument runs it too. This module parses a line with `brush-parser`
//! (a maintained POSIX/bash parser), removes quotes and escapes, and lists
//! every simple command the line may run (command substitutions, process
//! substitutions, here-documents and compound commands included) with its
//! words. What only the running shell can know (a word built from a
//! variable, a glob, a line too deep or too long to parse) is marked as
//! such, never guessed.
//!
//! Key types: [`Script`] (the commands of a line), [`Simple`] (one simple
//! command), [`Arg`] (one word, with what is known of it).

use std::collections::BTreeSet;

use brush_parser::ast;

// Word-level helpers, kept under policy/ (size limit): quoting contexts,
// glob detection, `$'…'` decoding.
#[path = "policy/shell_words.rs"]
mod words;
use words::{GlobScan, Quote};

// The word-level half of the walk: a word's pieces, expansions, assignments
// and arithmetic.
mod expansion;

/// Longest shell text analysed; anything longer cannot be known.
pub const MAX_SCRIPT_BYTES: usize = 256 * 1024;
/// Deepest nesting of brackets and compound commands handed to the parser,
/// which recurses on them (an over-estimate counted before parsing).
pub const MAX_NESTING: usize = 200;
/// Deepest nesting of lines within lines (`$( )`, `sh -c`, `eval`).
pub const MAX_DEPTH: usize = 16;
/// Most simple commands listed for one line, nested ones included.
pub const MAX_COMMANDS: usize = 10_000;
/// The parser runs on its own thread with this much stack, so no line that
/// passes [`MAX_NESTING`] can overflow it.
const PARSE_STACK_BYTES: usize = 64 << 20;

/// One piece of a word.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// Text known now (quotes and escapes removed, `~` resolved).
    Lit(String),
    /// Text only the running shell knows: a variable, a substitution.
    Dyn,
    /// A path below the text before it, only known when it runs (the
    /// files `find` hands to `-exec`): never `..`, so unlike [`Part::Dyn`]
    /// it cannot climb out of that text.
    Below,
}

/// One word of a command.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Arg {
    pub parts: Vec<Part>,
    /// Unquoted glob or brace characters: the shell may turn the word into
    /// other words.
    pub expands: bool,
    /// An unquoted expansion (or `"$@"`): field splitting may turn it into
    /// several words, options among them.
    pub splits: bool,
}

impl Arg {
    pub fn lit(s: impl Into<String>) -> Arg {
        Arg {
            parts: vec![Part::Lit(s.into())],
            ..Arg::default()
        }
    }

    /// A word only known when it runs.
    pub fn dynamic() -> Arg {
        Arg {
            parts: vec![Part::Dyn],
            ..Arg::default()
        }
    }

    /// Any number of words only known when they run (what `xargs` appends).
    pub fn words() -> Arg {
        Arg {
            splits: true,
            ..Arg::dynamic()
        }
    }

    /// The word's text, when the shell will pass exactly that.
    pub fn literal(&self) -> Option<String> {
        if self.expands {
            return None;
        }
        let mut s = String::new();
        for p in &self.parts {
            match p {
                Part::Lit(t) => s.push_str(t),
                Part::Dyn | Part::Below => return None,
            }
        }
        Some(s)
    }

    /// The known text, with the unknown parts left out.
    pub fn known(&self) -> String {
        self.parts
            .iter()
            .filter_map(|p| match p {
                Part::Lit(t) => Some(t.as_str()),
                Part::Dyn | Part::Below => None,
            })
            .collect()
    }

    pub fn is_dynamic(&self) -> bool {
        self.parts.iter().any(|p| !matches!(p, Part::Lit(_)))
    }

    /// For messages: the text with unknown parts shown as `…`.
    pub fn shown(&self) -> String {
        self.parts
            .iter()
            .map(|p| match p {
                Part::Lit(t) => t.as_str(),
                Part::Dyn | Part::Below => "…",
            })
            .collect()
    }
}

/// One simple command: what it sets and the words it runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Simple {
    /// `NAME=value` words before the command.
    pub assigns: Vec<(String, Arg)>,
    /// The command's words, redirections removed; may be empty.
    pub words: Vec<Arg>,
    /// Its own redirections, in order (not those of enclosing compounds).
    pub redirects: Vec<Redirect>,
}

/// A redirection: descriptor, and what it is connected to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Redirect {
    /// Writes into a file (`>`, `>>`, `>|`, `<>`, `&>`, `>&FILE`).
    Write(i32, Arg),
    /// Reads a file (`<`, `<>`).
    Read(i32, Arg),
    /// Reads this text: a here-document or here-string (literal when its
    /// text is known).
    Text(i32, Arg),
    /// A copy of another descriptor, closed, or a process substitution:
    /// what flows through it is only known when it runs.
    Other(i32),
}

impl Redirect {
    pub fn fd(&self) -> i32 {
        match self {
            Redirect::Write(fd, _)
            | Redirect::Read(fd, _)
            | Redirect::Text(fd, _)
            | Redirect::Other(fd) => *fd,
        }
    }
}

/// Every simple command a shell line may run.
#[derive(Debug, Clone, Default)]
pub struct Script {
    pub commands: Vec<Simple>,
    /// Why some of what the line runs cannot be known before it runs.
    pub unknown: Vec<String>,
    /// Functions the line defines (calling one runs its body, listed too).
    pub functions: BTreeSet<String>,
    /// Variables the line assigns anywhere.
    pub assigned: BTreeSet<String>,
    /// Files the line's redirections write (any command, compound or not).
    pub writes: Vec<Arg>,
    /// Arithmetic evaluates a variable: its value, an expression, may
    /// assign any other (`x='PATH=0'; : $((x))`).
    pub arith_vars: bool,
}

impl Script {
    pub fn unknowable(&mut self, why: impl Into<String>) {
        add_reason(&mut self.unknown, why);
    }
}

/// Most reasons kept for one command (the first say enough).
pub const MAX_REASONS: usize = 16;

/// Adds a reason something is unknowable, once, up to [`MAX_REASONS`].
pub fn add_reason(list: &mut Vec<String>, why: impl Into<String>) {
    let why = why.into();
    if !list.contains(&why) && list.len() < MAX_REASONS {
        list.push(why);
    }
}

/// Parses `text` as `sh -c` would, with `home` for `~` and `$HOME`.
/// `depth` is how deep this line already is inside others.
pub fn parse(text: &str, home: Option<&str>, depth: usize) -> Script {
    let mut w = Walker {
        out: Script::default(),
        home: home.map(str::to_string),
        depth,
        code_in_text: false,
        evaluates: false,
    };
    let text = text.to_string();
    // The parser recurses per nesting level: the whole walk runs on a
    // thread with a stack sized for MAX_NESTING.
    let walk = move || {
        w.program(&text);
        if w.code_in_text && w.evaluates {
            // bash evaluates `a[$(cmd)]` in quoted text given to
            // arithmetic, `let`, `declare`, `printf -v`, `[[ -eq ]]`…
            w.out.unknowable(
                "quoted text containing `$(…)` reaches a command bash may evaluate it in",
            );
        }
        w.out
    };
    let failed = |why: String| {
        let mut s = Script::default();
        s.unknowable(why);
        s
    };
    match std::thread::Builder::new()
        .name("shell-parse".into())
        .stack_size(PARSE_STACK_BYTES)
        .spawn(walk)
    {
        Ok(h) => h
            .join()
            .unwrap_or_else(|_| failed("the shell parser failed on it".into())),
        Err(e) => failed(format!("cannot start the shell parser: {e}")),
    }
}

/// An over-estimate of how deep `text` nests (quotes ignored).
fn nesting(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    let mut word = String::new();
    let on_word = |w: &str, depth: &mut usize| match w {
        "if" | "case" | "do" => *depth += 1,
        "fi" | "esac" | "done" => *depth = depth.saturating_sub(1),
        _ => {}
    };
    for c in text.chars() {
        if c.is_ascii_alphanumeric() || c == '_' {
            word.push(c);
            continue;
        }
        on_word(&word, &mut depth);
        word.clear();
        match c {
            '(' | '{' | '[' | '`' => depth += 1,
            ')' | '}' | ']' => depth = depth.saturating_sub(1),
            _ => {}
        }
        max = max.max(depth);
    }
    on_word(&word, &mut depth);
    max.max(depth)
}

/// Parses one line; a panic in the parser is a line it cannot parse.
fn parse_program(text: &str) -> Result<ast::Program, String> {
    let opts = options();
    let mut p = brush_parser::Parser::new(std::io::Cursor::new(text.as_bytes()), &opts);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| p.parse_program()))
        .map_err(|_| "the shell parser failed on it".to_string())?
        .map_err(|e| e.to_string())
}

fn options() -> brush_parser::ParserOptions {
    brush_parser::ParserOptions {
        // Off in a non-interactive bash; dash has none.
        enable_extended_globbing: false,
        ..Default::default()
    }
}

struct Walker {
    out: Script,
    home: Option<String>,
    depth: usize,
    /// Some known text contains `[` and `$(` or a backquote.
    code_in_text: bool,
    /// The line has a place bash evaluates text as arithmetic.
    evaluates: bool,
}

/// Builtins that evaluate their arguments as arithmetic (or may).
const EVALUATING: &[&str] = &[
    "let",
    "declare",
    "typeset",
    "local",
    "export",
    "readonly",
    "printf",
    "read",
    "unset",
    "test",
    "[",
    "mapfile",
    "readarray",
    "shift",
    "return",
    "exit",
    "wait",
];

impl Walker {
    fn program(&mut self, text: &str) {
        if self.depth > MAX_DEPTH {
            self.out
                .unknowable(format!("commands nested more than {MAX_DEPTH} levels deep"));
            return;
        }
        if text.len() > MAX_SCRIPT_BYTES {
            self.out.unknowable(format!(
                "a shell line longer than {} KiB",
                MAX_SCRIPT_BYTES / 1024
            ));
            return;
        }
        if nesting(text) > MAX_NESTING {
            self.out.unknowable(format!(
                "a shell line nested more than {MAX_NESTING} levels deep"
            ));
            return;
        }
        match parse_program(text) {
            Ok(p) => {
                for cc in &p.complete_commands {
                    self.list(cc);
                }
            }
            Err(e) => self
                .out
                .unknowable(format!("a shell line that does not parse ({e})")),
        }
    }

    fn nested(&mut self, text: &str) {
        self.depth += 1;
        self.program(text);
        self.depth -= 1;
    }

    fn list(&mut self, l: &ast::CompoundList) {
        for item in &l.0 {
            self.and_or(&item.0);
        }
    }

    fn and_or(&mut self, a: &ast::AndOrList) {
        self.pipeline(&a.first);
        for x in &a.additional {
            match x {
                ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p),
            }
        }
    }

    fn pipeline(&mut self, p: &ast::Pipeline) {
        for (i, c) in p.seq.iter().enumerate() {
            match (i, &p.timed, c) {
                // bash's `time` keyword is dash's /usr/bin/time, which
                // reads options (`time -o F cmd`): it stays a word.
                (0, Some(t), ast::Command::Simple(s)) => {
                    let mut time = vec![Arg::lit("time")];
                    if matches!(t, ast::PipelineTimed::TimedWithPosixOutput(_)) {
                        time.push(Arg::lit("-p"));
                    }
                    self.simple(s, time);
                }
                _ => self.command(c),
            }
        }
    }

    fn command(&mut self, c: &ast::Command) {
        match c {
            ast::Command::Simple(s) => self.simple(s, Vec::new()),
            ast::Command::Compound(cc, redirects) => {
                self.compound(cc);
                self.redirects(redirects.as_ref());
            }
            ast::Command::Function(f) => {
                match self.word(&f.fname).literal() {
                    Some(n) => {
                        self.out.functions.insert(n);
                    }
                    None => self
                        .out
                        .unknowable("a function whose name is only known when it runs"),
                }
                self.compound(&f.body.0);
                self.redirects(f.body.1.as_ref());
            }
            ast::Command::ExtendedTest(t, redirects) => {
                self.evaluates = true;
                self.test_expr(&t.expr);
                self.redirects(redirects.as_ref());
            }
        }
    }

    fn test_expr(&mut self, e: &ast::ExtendedTestExpr) {
        match e {
            ast::ExtendedTestExpr::And(a, b) | ast::ExtendedTestExpr::Or(a, b) => {
                self.test_expr(a);
                self.test_expr(b);
            }
            ast::ExtendedTestExpr::Not(a) | ast::ExtendedTestExpr::Parenthesized(a) => {
                self.test_expr(a)
            }
            ast::ExtendedTestExpr::UnaryTest(_, w) => {
                self.word(w);
            }
            ast::ExtendedTestExpr::BinaryTest(op, a, b) => {
                use ast::BinaryPredicate as B;
                if matches!(
                    op,
                    B::ArithmeticEqualTo
                        | B::ArithmeticNotEqualTo
                        | B::ArithmeticLessThan
                        | B::ArithmeticLessThanOrEqualTo
                        | B::ArithmeticGreaterThan
                        | B::ArithmeticGreaterThanOrEqualTo
                ) {
                    self.arith_names(&a.value);
                    self.arith_names(&b.value);
                }
                self.word(a);
                self.word(b);
            }
        }
    }

    fn compound(&mut self, c: &ast::CompoundCommand) {
        use ast::CompoundCommand as C;
        match c {
            C::Arithmetic(a) => self.arithmetic(&a.expr.value),
            C::ArithmeticForClause(f) => {
                for e in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.arithmetic(&e.value);
                }
                self.list(&f.body.list);
            }
            C::BraceGroup(b) => self.list(&b.list),
            C::Subshell(s) => self.list(&s.list),
            C::ForClause(f) => {
                self.out.assigned.insert(f.variable_name.clone());
                for w in f.values.iter().flatten() {
                    self.word(w);
                }
                self.list(&f.body.list);
            }
            C::CaseClause(c) => {
                self.word(&c.value);
                for item in &c.cases {
                    for p in &item.patterns {
                        self.word(p);
                    }
                    if let Some(l) = &item.cmd {
                        self.list(l);
                    }
                }
            }
            C::IfClause(i) => {
                self.list(&i.condition);
                self.list(&i.then);
                for e in i.elses.iter().flatten() {
                    if let Some(c) = &e.condition {
                        self.list(c);
                    }
                    self.list(&e.body);
                }
            }
            C::WhileClause(w) | C::UntilClause(w) => {
                self.list(&w.0);
                self.list(&w.1.list);
            }
            C::Coprocess(c) => {
                if let Some(n) = &c.name {
                    self.word(n);
                }
                self.command(&c.body);
            }
        }
    }

    fn redirects(&mut self, r: Option<&ast::RedirectList>) {
        for r in r.iter().flat_map(|r| r.0.iter()) {
            self.redirect(r);
        }
    }

    /// One redirection; the files it writes are listed in `writes`.
    fn redirect(&mut self, r: &ast::IoRedirect) -> Redirect {
        use ast::IoFileRedirectKind as K;
        use ast::IoFileRedirectTarget as T;
        match r {
            ast::IoRedirect::File(fd, kind, target) => {
                let input = matches!(kind, K::Read | K::DuplicateInput);
                let fd = fd.unwrap_or(if input { 0 } else { 1 });
                match target {
                    T::Filename(w) => {
                        let a = self.word(w);
                        match kind {
                            K::Read => Redirect::Read(fd, a),
                            K::DuplicateInput => Redirect::Other(fd),
                            K::ReadAndWrite => {
                                self.out.writes.push(a.clone());
                                Redirect::Read(fd, a)
                            }
                            _ => {
                                self.out.writes.push(a.clone());
                                Redirect::Write(fd, a)
                            }
                        }
                    }
                    T::Duplicate(w) => {
                        let a = self.word(w);
                        // `2>&1`, `<&3`, `>&-` copy or close descriptors;
                        // bash's `>&FILE` writes a file.
                        let fd_like = a.literal().is_some_and(|t| {
                            let t = t.strip_suffix('-').unwrap_or(&t);
                            t.chars().all(|c| c.is_ascii_digit())
                        });
                        if fd_like || input {
                            Redirect::Other(fd)
                        } else {
                            self.out.writes.push(a.clone());
                            Redirect::Write(fd, a)
                        }
                    }
                    T::Fd(_) => Redirect::Other(fd),
                    T::ProcessSubstitution(_, s) => {
                        self.list(&s.list);
                        Redirect::Other(fd)
                    }
                }
            }
            ast::IoRedirect::HereDocument(fd, h) => {
                let mut text = Arg::lit(h.doc.value.clone());
                if h.requires_expansion {
                    match brush_parser::word::parse_heredoc(&h.doc.value, &options()) {
                        Ok(pieces) => {
                            text = Arg::default();
                            let mut g = GlobScan::default();
                            self.pieces(&pieces, &h.doc.value, Quote::HereDoc, &mut text, &mut g);
                        }
                        Err(_) => {
                            self.out.unknowable("a here-document that does not parse");
                            text = Arg::dynamic();
                        }
                    }
                }
                text.expands = false;
                text.splits = false;
                Redirect::Text(fd.unwrap_or(0), text)
            }
            ast::IoRedirect::HereString(fd, w) => {
                let mut text = self.word(w);
                text.expands = false;
                text.splits = false;
                text.parts.push(Part::Lit("\n".into()));
                Redirect::Text(fd.unwrap_or(0), text)
            }
            ast::IoRedirect::OutputAndError(w, _) => {
                let a = self.word(w);
                self.out.writes.push(a.clone());
                Redirect::Write(1, a)
            }
        }
    }

    /// A simple command, after `words` (a `time` that prefixes it).
    fn simple(&mut self, s: &ast::SimpleCommand, words: Vec<Arg>) {
        let mut cmd = Simple {
            words,
            ..Simple::default()
        };
        for item in s.prefix.iter().flat_map(|p| p.0.iter()) {
            self.item(item, &mut cmd, true);
        }
        if let Some(w) = &s.word_or_name {
            let a = self.word(w);
            cmd.words.push(a);
        }
        for item in s.suffix.iter().flat_map(|p| p.0.iter()) {
            self.item(item, &mut cmd, false);
        }
        if let Some(p) = cmd.words.first().and_then(Arg::literal) {
            if EVALUATING.contains(&p.as_str()) {
                self.evaluates = true;
            }
            // `let` and `declare -i` evaluate their words as arithmetic.
            let integer = matches!(p.as_str(), "declare" | "typeset" | "local")
                && cmd.words.iter().any(|w| {
                    w.literal()
                        .is_some_and(|t| t.starts_with('-') && t.contains('i'))
                });
            if p == "let" || integer {
                for item in s.suffix.iter().flat_map(|p| p.0.iter()) {
                    match item {
                        ast::CommandPrefixOrSuffixItem::Word(w)
                        | ast::CommandPrefixOrSuffixItem::AssignmentWord(_, w) => {
                            self.arith_names(&w.value)
                        }
                        _ => {}
                    }
                }
            }
        }
        if self.out.commands.len() >= MAX_COMMANDS {
            self.out
                .unknowable(format!("more than {MAX_COMMANDS} commands in one line"));
            return;
        }
        self.out.commands.push(cmd);
    }

    /// One word, redirection or assignment around a command's name.
    fn item(&mut self, item: &ast::CommandPrefixOrSuffixItem, cmd: &mut Simple, before_name: bool) {
        use ast::CommandPrefixOrSuffixItem as I;
        match item {
            I::IoRedirect(r) => {
                let r = self.redirect(r);
                cmd.redirects.push(r);
            }
            I::Word(w) => cmd.words.push(self.word(w)),
            I::AssignmentWord(a, _) => {
                let (name, value) = self.assignment(a);
                if before_name {
                    cmd.assigns.push((name, value));
                } else {
                    // `export A=$(x)`: an argument, `A=` and its value.
                    let mut arg = Arg::lit(format!("{name}="));
                    arg.parts.extend(value.parts);
                    arg.expands = value.expands;
                    cmd.words.push(arg);
                }
            }
            I::ProcessSubstitution(_, sub) => {
                self.list(&sub.list);
                cmd.words.push(Arg::dynamic());
            }
        }
    }
}

// The tests live under policy/ (size limit) but are this module's own.
#[cfg(test)]
#[path = "policy/tests/shell.rs"]
mod tests;
