//! The architecture, kept as code. Each rule below is one `#[test]`; a
//! failure lists every offence (file:line and what), so the fix is plain.
//!
//! 1. `the_domain_stays_pure`: no file under `src/domain/` uses `actix`
//!    (or `actix_*`), `sea_orm`, `reqwest`, `sqlx` or `tokio` (or their
//!    `*_` companions), nor reads a clock: `Utc::now`, `Local::now`,
//!    `SystemTime::now`, `Instant::now`, `crate::clock`. The domain is given
//!    `now`; the caller owns the clock and the I/O.
//! 2. `the_store_never_reaches_up`: no file under `src/store/` names
//!    `crate::actors`, `crate::http`, `crate::startup`, `crate::ai` or
//!    `crate::media` (by any path: `super::super::http` counts too). The
//!    store is below them: it is given values, never their types.
//! 3. `functions_read_as_stages`: no function in `src/` or `bench/src/` is
//!    longer than 150 lines, from the line with `fn name` to the line of its
//!    closing brace, inclusive (a declaration without a body, such as a
//!    trait's `fn run(..) -> T;` over several lines, has none). A longer one
//!    is a list of stages waiting to be named: split it into functions that
//!    say what each stage does.
//! 4. `no_circles_between_files`: the files of `src/` (one module per file;
//!    `src/a/b.rs` and `src/a/b/mod.rs` are `a::b`, `src/lib.rs` is the root,
//!    `src/main.rs` is left out) form no circle of dependencies, and neither
//!    do those of `bench/src/` (a crate of its own). A file depends on
//!    another when its code names a path into it: `crate::a::b::Item`,
//!    `super::x::Item`, `self::x`, each leaf of a `use` tree
//!    (`use super::{admin, x::{y, z}}`), a parent's bare paths into its own
//!    child modules (`ranking::Rank` in `store/mod.rs`), and a path through a
//!    module brought in by `use` (`use crate::store;` then
//!    `store::sagas::claim`). Attribute arguments count (`#[utoipa::path(..
//!    body = super::openapi::ErrorBody)]`). A path resolves to the longest
//!    prefix that is a module file; inside an inline module
//!    (`mod prelude { .. }`) paths are relative to that module. A file's
//!    dependencies on itself and on its ancestors (a child using its
//!    parent's items) are the module tree, not circles. To break a circle,
//!    cut one of the edges the failure lists: move the shared item down
//!    (into the domain or a leaf module), or pass it in.
//! 5. `one_reader_of_the_client_address`: no file in `src/` but
//!    `src/http/rate_limit.rs` (`ClientAddress`) asks a request where it
//!    comes from (`peer_addr`, `connection_info`, `realip_remote_addr`):
//!    the rate limits, the audit trail and the logs all name the client
//!    as `--trusted-proxies` says, through `AppState::client_address`.
//!
//! "Code" means what the compiler reads: comments, doc comments and string,
//! byte-string and char literals never count. Rule 4 also leaves out
//! `#[cfg(test)] mod .. { .. }` blocks (unit tests may reach anywhere);
//! rules 1 and 2 do not. Glob imports (`use super::*`) are not followed.
//!
//! The analysis is a small lexer (`code_only`, `tokenize`) and a path
//! scanner (`paths_in`, `absolute`); the `self_check_*` tests at the end test
//! them, and the cycle finder, on hand-made input.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

/// A module, as its path below the crate root (`["store", "sagas"]`; the root is `[]`).
type ModPath = Vec<String>;

/// The longest a function may be, in lines (rule 3).
const MAX_FN_LINES: usize = 150;

/// Outside crates the domain may not name (rule 1); `name_*` crates count too.
const IO_CRATES: [&str; 5] = ["actix", "sea_orm", "reqwest", "sqlx", "tokio"];

/// Types whose `::now` reads the clock (rule 1).
const CLOCKS: [&str; 4] = ["Utc", "Local", "SystemTime", "Instant"];

/// The top modules the store may not name (rule 2).
const ABOVE_THE_STORE: [&str; 5] = ["actors", "http", "startup", "ai", "media"];

// ---------------------------------------------------------------------------
// The lexer: code with comments and literals blanked, then tokens.
// ---------------------------------------------------------------------------

/// Returns `src` with comments and string/byte-string/char literals replaced by spaces, newlines kept (lines still match).
fn code_only(src: &str) -> String {
    let chars: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        let literal_end = if c == '/' && next == Some('/') {
            Some(line_comment_end(&chars, i))
        } else if c == '/' && next == Some('*') {
            Some(block_comment_end(&chars, i))
        } else if c == '"' {
            Some(quoted_end(&chars, i))
        } else if c == '\'' {
            char_literal_end(&chars, i)
        } else if is_ident_start(c) {
            let word_end = ident_end(&chars, i);
            let end = prefixed_literal_end(&chars, i, word_end);
            if end.is_none() {
                out.extend(&chars[i..word_end]);
                i = word_end;
                continue;
            }
            end
        } else {
            None
        };
        match literal_end {
            Some(end) => {
                blank(&chars[i..end], &mut out);
                i = end;
            }
            None => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// Writes a space for each char of `text` (a newline for a newline).
fn blank(text: &[char], out: &mut String) {
    out.extend(text.iter().map(|&c| if c == '\n' { '\n' } else { ' ' }));
}

/// Whether `c` can start an identifier.
fn is_ident_start(c: char) -> bool {
    c == '_' || c.is_alphabetic()
}

/// Whether `c` can continue an identifier.
fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// The index just past the identifier (or number) starting at `i`.
fn ident_end(chars: &[char], i: usize) -> usize {
    let mut j = i;
    while j < chars.len() && is_ident_char(chars[j]) {
        j += 1;
    }
    j
}

/// The index of the newline ending the `//` comment at `i` (or the end).
fn line_comment_end(chars: &[char], i: usize) -> usize {
    (i..chars.len())
        .find(|&j| chars[j] == '\n')
        .unwrap_or(chars.len())
}

/// The index just past the (possibly nested) `/* .. */` comment at `i`.
fn block_comment_end(chars: &[char], i: usize) -> usize {
    let (mut depth, mut j) = (0usize, i);
    while j + 1 < chars.len() {
        if chars[j] == '/' && chars[j + 1] == '*' {
            depth += 1;
            j += 2;
        } else if chars[j] == '*' && chars[j + 1] == '/' {
            depth -= 1;
            j += 2;
            if depth == 0 {
                return j;
            }
        } else {
            j += 1;
        }
    }
    chars.len()
}

/// The index just past the `"..."` literal whose opening quote is at `i` (escapes skipped).
fn quoted_end(chars: &[char], i: usize) -> usize {
    let mut j = i + 1;
    while j < chars.len() {
        match chars[j] {
            '\\' => j += 2,
            '"' => return j + 1,
            _ => j += 1,
        }
    }
    chars.len()
}

/// The index just past the raw string whose `#`s or `"` start at `i`, or None for a raw identifier (`r#type`).
fn raw_string_end(chars: &[char], i: usize) -> Option<usize> {
    let hashes = chars[i..].iter().take_while(|&&c| c == '#').count();
    if chars.get(i + hashes) != Some(&'"') {
        return None;
    }
    let mut j = i + hashes + 1;
    while j < chars.len() {
        let closes = chars[j] == '"'
            && chars.len() >= j + 1 + hashes
            && chars[j + 1..j + 1 + hashes].iter().all(|&c| c == '#');
        if closes {
            return Some(j + 1 + hashes);
        }
        j += 1;
    }
    Some(chars.len())
}

/// The index just past the char literal at `i` (`'x'`, `'\''`, `'\u{1F600}'`), or None for a lifetime or label (`'a`).
fn char_literal_end(chars: &[char], i: usize) -> Option<usize> {
    match (chars.get(i + 1), chars.get(i + 2)) {
        (Some('\\'), Some(_)) => (i + 3..chars.len())
            .find(|&j| chars[j] == '\'')
            .map(|j| j + 1),
        (Some(c), Some('\'')) if *c != '\n' => Some(i + 3),
        _ => None,
    }
}

/// The index just past a literal with a prefix (`b"..."`, `b'x'`, `r#".."#`, `br".."`, `c".."`), None when the word is a plain identifier.
fn prefixed_literal_end(chars: &[char], start: usize, word_end: usize) -> Option<usize> {
    let word: String = chars[start..word_end].iter().collect();
    let next = *chars.get(word_end)?;
    match (word.as_str(), next) {
        ("b" | "c", '"') => Some(quoted_end(chars, word_end)),
        ("b", '\'') => char_literal_end(chars, word_end),
        ("r" | "br" | "cr", '"' | '#') => raw_string_end(chars, word_end),
        _ => None,
    }
}

/// One token of code: an identifier, a number, `::`, or one punctuation char.
#[derive(Debug, Clone, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

/// Splits blanked code (see `code_only`) into tokens with 1-based lines; lifetimes are dropped.
fn tokenize(code: &str) -> Vec<Token> {
    let chars: Vec<char> = code.chars().collect();
    let (mut tokens, mut line, mut i) = (Vec::new(), 1, 0);
    while i < chars.len() {
        let c = chars[i];
        let (text, end) = if c == '\n' || c.is_whitespace() {
            line += usize::from(c == '\n');
            (None, i + 1)
        } else if c == '\'' && chars.get(i + 1).is_some_and(|&n| is_ident_start(n)) {
            (None, ident_end(&chars, i + 1))
        } else if c == 'r'
            && chars.get(i + 1) == Some(&'#')
            && chars.get(i + 2).is_some_and(|&n| is_ident_start(n))
        {
            let end = ident_end(&chars, i + 2);
            (Some(chars[i + 2..end].iter().collect()), end)
        } else if is_ident_char(c) {
            let end = ident_end(&chars, i);
            (Some(chars[i..end].iter().collect()), end)
        } else if c == ':' && chars.get(i + 1) == Some(&':') {
            (Some("::".to_string()), i + 2)
        } else {
            (Some(c.to_string()), i + 1)
        };
        if let Some(text) = text {
            tokens.push(Token { text, line });
        }
        i = end;
    }
    tokens
}

/// The text of the token at `i`, or "" past the end.
fn text_at(tokens: &[Token], i: usize) -> &str {
    tokens.get(i).map_or("", |t| t.text.as_str())
}

/// Whether the token at `i` is an identifier (not a number, not punctuation).
fn ident_at(tokens: &[Token], i: usize) -> bool {
    tokens
        .get(i)
        .and_then(|t| t.text.chars().next())
        .is_some_and(is_ident_start)
}

// ---------------------------------------------------------------------------
// Paths: every `a::b` in the code, each `use` tree leaf, where it sits.
// ---------------------------------------------------------------------------

/// A path as written, with the module (file module plus inline modules) it is written in.
#[derive(Debug, Clone)]
struct PathUse {
    line: usize,
    scope: ModPath,
    segments: Vec<String>,
    alias: Option<String>,
    in_use: bool,
    in_tests: bool,
}

/// One leaf of a path tree (`super::x::{y, z as w}` has two).
struct Leaf {
    segments: Vec<String>,
    alias: Option<String>,
    line: usize,
}

/// An inline module being walked: its name, the brace depth inside it, and whether it is a `#[cfg(test)]` one.
struct Inline {
    name: String,
    depth: usize,
    tests: bool,
}

/// Every path in a file's tokens (`a::b..` and each leaf of a `use` tree), with the inline module it sits in.
fn paths_in(tokens: &[Token], file_module: &[String]) -> Vec<PathUse> {
    let mut found = Vec::new();
    let mut inline: Vec<Inline> = Vec::new();
    let (mut depth, mut cfg_test, mut in_use, mut i) = (0, false, false, 0);
    while i < tokens.len() {
        if is_cfg_test_at(tokens, i) {
            cfg_test = true;
            i += 7;
            continue;
        }
        if text_at(tokens, i) == "mod" && ident_at(tokens, i + 1) && text_at(tokens, i + 2) == "{" {
            depth += 1;
            let tests = cfg_test || inline.iter().any(|m| m.tests);
            let name = tokens[i + 1].text.clone();
            inline.push(Inline { name, depth, tests });
            (cfg_test, i) = (false, i + 3);
            continue;
        }
        match text_at(tokens, i) {
            "{" => (depth, cfg_test) = (depth + 1, false),
            "}" => {
                if inline.last().is_some_and(|m| m.depth == depth) {
                    inline.pop();
                }
                (depth, cfg_test) = (depth.saturating_sub(1), false);
            }
            ";" => (in_use, cfg_test) = (false, false),
            "use" => in_use = true,
            _ => {}
        }
        if !starts_path(tokens, i) {
            i += 1;
            continue;
        }
        let (leaves, next) = parse_tree(tokens, i, Vec::new());
        let mut scope = file_module.to_vec();
        scope.extend(inline.iter().map(|m| m.name.clone()));
        let in_tests = inline.iter().any(|m| m.tests);
        found.extend(leaves.into_iter().map(|leaf| PathUse {
            line: leaf.line,
            scope: scope.clone(),
            segments: leaf.segments,
            alias: leaf.alias,
            in_use,
            in_tests,
        }));
        i = next;
    }
    found
}

/// Whether the tokens at `i` are `#[cfg(test)]`.
fn is_cfg_test_at(tokens: &[Token], i: usize) -> bool {
    let want = ["#", "[", "cfg", "(", "test", ")", "]"];
    want.iter()
        .enumerate()
        .all(|(k, w)| text_at(tokens, i + k) == *w)
}

/// Whether a path starts at `i`: an identifier followed by `::`, not itself after `::` or `.`.
fn starts_path(tokens: &[Token], i: usize) -> bool {
    let before = if i == 0 { "" } else { text_at(tokens, i - 1) };
    ident_at(tokens, i) && text_at(tokens, i + 1) == "::" && before != "::" && before != "."
}

/// Parses the path (tree) at `i` under `prefix`: its leaves and the index just past it.
fn parse_tree(tokens: &[Token], mut i: usize, prefix: Vec<String>) -> (Vec<Leaf>, usize) {
    let line = tokens[i].line;
    let mut segments = prefix;
    loop {
        match text_at(tokens, i) {
            "{" => return parse_group(tokens, i + 1, &segments),
            "*" => return (vec![leaf(segments, None, line)], i + 1),
            "self" if !segments.is_empty() => i += 1,
            word => {
                segments.push(word.to_string());
                i += 1;
            }
        }
        let more = ident_at(tokens, i + 1) || matches!(text_at(tokens, i + 1), "{" | "*");
        if text_at(tokens, i) != "::" || !more {
            break;
        }
        i += 1;
    }
    let mut alias = None;
    if text_at(tokens, i) == "as" && ident_at(tokens, i + 1) {
        alias = Some(tokens[i + 1].text.clone());
        i += 2;
    }
    (vec![leaf(segments, alias, line)], i)
}

/// Parses the group `{a, b::c, d::{e}}` whose first item is at `i`: its leaves and the index past its `}`.
fn parse_group(tokens: &[Token], mut i: usize, prefix: &[String]) -> (Vec<Leaf>, usize) {
    let mut leaves = Vec::new();
    while i < tokens.len() && text_at(tokens, i) != "}" {
        if ident_at(tokens, i) || matches!(text_at(tokens, i), "{" | "*") {
            let (mut more, next) = parse_tree(tokens, i, prefix.to_vec());
            leaves.append(&mut more);
            i = next;
        } else {
            i += 1;
        }
    }
    (leaves, i + 1)
}

/// A leaf of a path tree.
fn leaf(segments: Vec<String>, alias: Option<String>, line: usize) -> Leaf {
    Leaf {
        segments,
        alias,
        line,
    }
}

/// Modules brought in by `use` under a name, per module: (scope, name) -> module.
type Aliases = BTreeMap<(ModPath, String), ModPath>;

/// The modules a file's `use` items bring in by name (`use crate::store;`, `use super::openapi as api;`).
fn module_aliases(paths: &[PathUse], modules: &BTreeSet<ModPath>) -> Aliases {
    let mut aliases = Aliases::new();
    for p in paths.iter().filter(|p| p.in_use) {
        let Some(target) = absolute(p, modules, &Aliases::new()) else {
            continue;
        };
        let name = p.alias.clone().or_else(|| p.segments.last().cloned());
        match name {
            Some(name) if modules.contains(&target) && name != "_" => {
                aliases.insert((p.scope.clone(), name), target);
            }
            _ => {}
        }
    }
    aliases
}

/// The crate-absolute path a path names, or None for an outside crate, a std item or a local.
fn absolute(p: &PathUse, modules: &BTreeSet<ModPath>, aliases: &Aliases) -> Option<Vec<String>> {
    let (first, rest) = p.segments.split_first()?;
    let joined = |base: &[String], tail: &[String]| [base, tail].concat();
    match first.as_str() {
        "crate" => Some(rest.to_vec()),
        "self" => Some(joined(&p.scope, rest)),
        "super" => {
            let ups = 1 + rest.iter().take_while(|s| *s == "super").count();
            let base = p.scope.len().checked_sub(ups)?;
            Some(joined(&p.scope[..base], &rest[ups - 1..]))
        }
        _ if modules.contains(&joined(&p.scope, &p.segments[..1])) => {
            Some(joined(&p.scope, &p.segments))
        }
        _ => aliases
            .get(&(p.scope.clone(), first.clone()))
            .map(|target| joined(target, rest)),
    }
}

/// The module file a crate-absolute path falls in: its longest prefix that is a module.
fn module_of(path: &[String], modules: &BTreeSet<ModPath>) -> ModPath {
    (0..=path.len())
        .rev()
        .map(|k| path[..k].to_vec())
        .find(|prefix| modules.contains(prefix))
        .unwrap_or_default()
}

/// A path of a file that names something in its own crate.
#[derive(Debug, Clone)]
struct Reference {
    line: usize,
    written: String,
    absolute: Vec<String>,
    module: ModPath,
    in_tests: bool,
}

/// Every path in `src` (the file of module `me`) that names its own crate, resolved.
fn references(me: &[String], src: &str, modules: &BTreeSet<ModPath>) -> Vec<Reference> {
    let paths = paths_in(&tokenize(&code_only(src)), me);
    let aliases = module_aliases(&paths, modules);
    let mut found = Vec::new();
    for p in &paths {
        if let Some(absolute) = absolute(p, modules, &aliases) {
            found.push(Reference {
                line: p.line,
                written: p.segments.join("::"),
                module: module_of(&absolute, modules),
                absolute,
                in_tests: p.in_tests,
            });
        }
    }
    found
}

/// Where a dependency is named: line and path as written.
type Evidence = (usize, String);

/// A file's dependencies on other files of its crate (not itself, not its ancestors, not from unit tests), each with where it is named.
fn dependencies(
    me: &[String],
    src: &str,
    modules: &BTreeSet<ModPath>,
) -> BTreeMap<ModPath, Vec<Evidence>> {
    let mut deps: BTreeMap<ModPath, Vec<Evidence>> = BTreeMap::new();
    for r in references(me, src, modules) {
        if r.in_tests || me.starts_with(&r.module) {
            continue;
        }
        deps.entry(r.module).or_default().push((r.line, r.written));
    }
    deps
}

// ---------------------------------------------------------------------------
// Circles: strongly connected components (Tarjan).
// ---------------------------------------------------------------------------

/// Tarjan's walk state over a graph.
struct Tarjan<'g, N: Ord> {
    graph: &'g BTreeMap<N, BTreeSet<N>>,
    index: BTreeMap<&'g N, usize>,
    low: BTreeMap<&'g N, usize>,
    stack: Vec<&'g N>,
    on_stack: BTreeSet<&'g N>,
    groups: Vec<Vec<N>>,
}

/// The strongly connected components of more than one node (the circles), each sorted.
fn strongly_connected<N: Ord + Clone>(graph: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    let mut walk = Tarjan {
        graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on_stack: BTreeSet::new(),
        groups: Vec::new(),
    };
    for node in graph.keys() {
        if !walk.index.contains_key(node) {
            walk.visit(node);
        }
    }
    walk.groups
}

impl<'g, N: Ord + Clone> Tarjan<'g, N> {
    /// Visits `v` depth first; pops its component when `v` is the component's root.
    fn visit(&mut self, v: &'g N) {
        let n = self.index.len();
        self.index.insert(v, n);
        self.low.insert(v, n);
        self.stack.push(v);
        self.on_stack.insert(v);
        for w in self.graph.get(v).into_iter().flatten() {
            let w = self.graph.get_key_value(w).map_or(w, |(k, _)| k);
            if !self.index.contains_key(w) {
                self.visit(w);
                let low = self.low[v].min(self.low[w]);
                self.low.insert(v, low);
            } else if self.on_stack.contains(w) {
                let low = self.low[v].min(self.index[w]);
                self.low.insert(v, low);
            }
        }
        if self.low[v] == self.index[v] {
            self.pop_component(v);
        }
    }

    /// Pops the stack down to `root`; keeps the component when it has more than one node.
    fn pop_component(&mut self, root: &'g N) {
        let mut group = Vec::new();
        while let Some(w) = self.stack.pop() {
            self.on_stack.remove(w);
            group.push(w.clone());
            if w == root {
                break;
            }
        }
        if group.len() > 1 {
            group.sort();
            self.groups.push(group);
        }
    }
}

// ---------------------------------------------------------------------------
// Files and crates.
// ---------------------------------------------------------------------------

/// The `.rs` files under `dir`, recursively, sorted.
fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            files.extend(rust_files(&path));
        } else if path.extension().is_some_and(|ext| ext == "rs") {
            files.push(path);
        }
    }
    files
}

/// The path of `file` relative to the package root, with `/` (for messages).
fn shown(file: &Path) -> String {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let rel = file.strip_prefix(root).unwrap_or(file);
    rel.to_string_lossy().replace('\\', "/")
}

/// A module as `a/b` (the crate root as `lib`).
fn mod_name(module: &[String]) -> String {
    if module.is_empty() {
        "lib".to_string()
    } else {
        module.join("/")
    }
}

/// The module a file of a crate is (`a/b.rs`, `a/b/mod.rs` -> a::b; `lib.rs` -> root), None for `main.rs`.
fn module_path(src_dir: &Path, file: &Path) -> Option<ModPath> {
    let rel = file.strip_prefix(src_dir).ok()?.with_extension("");
    let mut parts: ModPath = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if parts == ["main"] {
        return None;
    }
    if parts == ["lib"] || parts.last().is_some_and(|last| last == "mod") {
        parts.pop();
    }
    Some(parts)
}

/// One crate's module files: module -> (file, source).
struct Crate {
    dir: String,
    files: BTreeMap<ModPath, (PathBuf, String)>,
}

impl Crate {
    /// Reads the module files of the crate whose sources are in `dir` (relative to the package root).
    fn load(dir: &str) -> Crate {
        let src_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(dir);
        let mut files = BTreeMap::new();
        for file in rust_files(&src_dir) {
            if let Some(module) = module_path(&src_dir, &file) {
                let text = fs::read_to_string(&file).expect("a readable source file");
                files.insert(module, (file, text));
            }
        }
        Crate {
            dir: dir.to_string(),
            files,
        }
    }

    /// The set of its modules that are files.
    fn modules(&self) -> BTreeSet<ModPath> {
        self.files.keys().cloned().collect()
    }

    /// The files whose module lies under `top` (`["domain"]`).
    fn under<'c>(
        &'c self,
        top: &'c [&str],
    ) -> impl Iterator<Item = (&'c ModPath, &'c (PathBuf, String))> {
        self.files.iter().filter(move |(m, _)| {
            m.len() >= top.len() && m.iter().zip(top.iter()).all(|(a, b)| a == b)
        })
    }
}

/// Fails with `title` and the offences, one a line, when there are any.
fn fail_on(title: &str, offences: &[String]) {
    if !offences.is_empty() {
        panic!(
            "{title} ({} found):\n  {}\n",
            offences.len(),
            offences.join("\n  ")
        );
    }
}

// ---------------------------------------------------------------------------
// Rule 1: the domain stays pure.
// ---------------------------------------------------------------------------

/// The I/O crates (rule 1) a file's tokens name, as (line, what).
fn io_crates_named(tokens: &[Token]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let io = IO_CRATES
            .iter()
            .any(|c| t.text == *c || t.text.starts_with(&format!("{c}_")));
        let before = |k: usize| if i >= k { text_at(tokens, i - k) } else { "" };
        let is_root = before(1) != "::" && before(1) != ".";
        let named = text_at(tokens, i + 1) == "::"
            || before(1) == "use"
            || (before(1) == "crate" && before(2) == "extern");
        if io && is_root && named {
            found.push((t.line, format!("uses `{}`", t.text)));
        }
    }
    found
}

/// The clock reads (`Utc::now` and the like) in a file's tokens, as (line, what).
fn clock_reads(tokens: &[Token]) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (i, t) in tokens.iter().enumerate() {
        let now = text_at(tokens, i + 1) == "::" && text_at(tokens, i + 2) == "now";
        if now && CLOCKS.contains(&t.text.as_str()) {
            found.push((t.line, format!("reads the clock: `{}::now`", t.text)));
        }
    }
    found
}

/// Rule 1: no file under src/domain/ uses actix, sea_orm, reqwest, sqlx, tokio, or reads a clock.
#[test]
fn the_domain_stays_pure() {
    let krate = Crate::load("src");
    let modules = krate.modules();
    let mut offences = Vec::new();
    for (module, (file, src)) in krate.under(&["domain"]) {
        let tokens = tokenize(&code_only(src));
        let mut found = io_crates_named(&tokens);
        found.extend(clock_reads(&tokens));
        for r in references(module, src, &modules) {
            if r.absolute.first().is_some_and(|top| top == "clock") {
                found.push((r.line, format!("reads the clock: `{}`", r.written)));
            }
        }
        found.sort();
        let file = shown(file);
        offences.extend(
            found
                .into_iter()
                .map(|(l, what)| format!("{file}:{l}: {what}")),
        );
    }
    fail_on(
        "src/domain/ must stay pure: no actix, sea_orm, reqwest, sqlx, tokio, no clock \
         (take `now` as an argument; do the I/O in store/, actors/, http/)",
        &offences,
    );
}

// ---------------------------------------------------------------------------
// Rule 2: the store never reaches up.
// ---------------------------------------------------------------------------

/// Rule 2: no file under src/store/ uses crate::actors, crate::http or crate::startup.
#[test]
fn the_store_never_reaches_up() {
    let krate = Crate::load("src");
    let modules = krate.modules();
    let mut offences = Vec::new();
    for (module, (file, src)) in krate.under(&["store"]) {
        for r in references(module, src, &modules) {
            let top = r.absolute.first().map(String::as_str).unwrap_or("");
            if ABOVE_THE_STORE.contains(&top) {
                let what = format!("names `{}` (crate::{top})", r.written);
                offences.push(format!("{}:{}: {what}", shown(file), r.line));
            }
        }
    }
    fail_on(
        "src/store/ must not reach up into actors/, http/, startup, ai/ or media/ \
         (move the shared item down into store/ or domain/, or pass it in)",
        &offences,
    );
}

// ---------------------------------------------------------------------------
// Rule 3: functions read as stages.
// ---------------------------------------------------------------------------

/// The name a line declares, by `^\s*(pub(\(..\))?\s+)?(const\s+)?(async\s+)?(unsafe\s+)?fn\s+(\w+)`.
fn declared_fn(line: &str) -> Option<&str> {
    let mut rest = line.trim_start();
    if let Some(after) = rest.strip_prefix("pub") {
        let after = match after.strip_prefix('(') {
            Some(inner) => &inner[inner.find(')')? + 1..],
            None => after,
        };
        rest = word_gap(after)?;
    }
    for keyword in ["const", "async", "unsafe"] {
        if let Some(after) = rest.strip_prefix(keyword).and_then(word_gap) {
            rest = after;
        }
    }
    let after_fn = word_gap(rest.strip_prefix("fn")?)?;
    let end = after_fn
        .find(|c: char| !is_ident_char(c))
        .unwrap_or(after_fn.len());
    (end > 0).then(|| &after_fn[..end])
}

/// `text` after its leading whitespace, None when it does not start with whitespace.
fn word_gap(text: &str) -> Option<&str> {
    let trimmed = text.trim_start();
    (trimmed.len() < text.len()).then_some(trimmed)
}

/// The 0-based line of the brace closing the body that starts after byte `from`, None when the fn has no body.
fn body_end_line(code: &str, from: usize) -> Option<usize> {
    let (mut nesting, mut braces, mut line) = (0i32, 0i32, 0);
    for c in code[from..].chars() {
        match c {
            '\n' => line += 1,
            '(' | '[' => nesting += 1,
            ')' | ']' => nesting -= 1,
            ';' if nesting == 0 && braces == 0 => return None,
            '{' => braces += 1,
            '}' => {
                braces -= 1;
                if braces == 0 {
                    return Some(line);
                }
            }
            _ => {}
        }
    }
    None
}

/// Each function with a body in blanked code: (1-based line of `fn`, name, length in lines).
fn function_lengths(code: &str) -> Vec<(usize, String, usize)> {
    let mut found = Vec::new();
    let mut offset = 0;
    for (index, line) in code.split('\n').enumerate() {
        let start = offset;
        offset += line.len() + 1;
        let Some(name) = declared_fn(line) else {
            continue;
        };
        if line.trim_end().ends_with(';') {
            continue;
        }
        if let Some(extra) = body_end_line(code, start) {
            found.push((index + 1, name.to_string(), extra + 1));
        }
    }
    found
}

/// Rule 3: no function in src/ or bench/src/ is longer than MAX_FN_LINES lines.
#[test]
fn functions_read_as_stages() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut all = Vec::new();
    for dir in ["src", "bench/src"] {
        for file in rust_files(&root.join(dir)) {
            let src = fs::read_to_string(&file).expect("a readable source file");
            for (line, name, len) in function_lengths(&code_only(&src)) {
                all.push((len, format!("{}:{line}: fn {name}", shown(&file))));
            }
        }
    }
    all.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut log = std::io::stderr().lock();
    let _ = writeln!(log, "the five longest functions:");
    for (len, what) in all.iter().take(5) {
        let _ = writeln!(log, "  {len:4} lines  {what}");
    }
    let offences: Vec<String> = all
        .iter()
        .filter(|(len, _)| *len > MAX_FN_LINES)
        .map(|(len, what)| format!("{what} is {len} lines"))
        .collect();
    fail_on(
        &format!("functions longer than {MAX_FN_LINES} lines (split each into named stages)"),
        &offences,
    );
}

// ---------------------------------------------------------------------------
// Rule 4: no circles between files.
// ---------------------------------------------------------------------------

/// Each file's dependencies on the other files of its crate, with where they are named.
fn crate_graph(krate: &Crate) -> BTreeMap<ModPath, BTreeMap<ModPath, Vec<Evidence>>> {
    let modules = krate.modules();
    krate
        .files
        .iter()
        .map(|(module, (_, src))| (module.clone(), dependencies(module, src, &modules)))
        .collect()
}

/// The circles of a crate's files, each described with the edges inside it and where each is named.
fn circles_in(krate: &Crate) -> Vec<String> {
    let graph = crate_graph(krate);
    let bare: BTreeMap<ModPath, BTreeSet<ModPath>> = graph
        .iter()
        .map(|(m, deps)| (m.clone(), deps.keys().cloned().collect()))
        .collect();
    let mut found = Vec::new();
    for group in strongly_connected(&bare) {
        let names: Vec<String> = group.iter().map(|m| mod_name(m)).collect();
        let mut text = format!(
            "{}/: {} files: {}",
            krate.dir,
            group.len(),
            names.join(", ")
        );
        for from in &group {
            let file = shown(&krate.files[from].0);
            for (to, evidence) in graph[from].iter().filter(|(to, _)| group.contains(to)) {
                let (line, written) = &evidence[0];
                let more = match evidence.len() - 1 {
                    0 => String::new(),
                    n => format!(", and {n} more"),
                };
                text.push_str(&format!(
                    "\n      {} -> {}    ({file}:{line} `{written}`{more})",
                    mod_name(from),
                    mod_name(to)
                ));
            }
        }
        found.push(text);
    }
    found
}

/// Rule 4: the files of src/ (and, apart, of bench/src/) form no circle of dependencies.
#[test]
fn no_circles_between_files() {
    let mut offences = Vec::new();
    for dir in ["src", "bench/src"] {
        offences.extend(circles_in(&Crate::load(dir)));
    }
    fail_on(
        "circles between files (each group, then the edges inside it: \
         cut one edge per circle)",
        &offences,
    );
}

// ---------------------------------------------------------------------------
// Self-checks of the analysis.
/// Where a request says it comes from, for rule 5.
const CLIENT_ADDRESS_READS: [&str; 3] = ["peer_addr", "connection_info", "realip_remote_addr"];

#[test]
fn one_reader_of_the_client_address() {
    let krate = Crate::load("src");
    let mut offences = Vec::new();
    for (module, (file, src)) in krate.under(&[]) {
        if module.as_slice() == ["http", "rate_limit"] {
            continue;
        }
        for token in tokenize(&code_only(src)) {
            if CLIENT_ADDRESS_READS.contains(&token.text.as_str()) {
                offences.push(format!("{}:{}: `{}`", shown(file), token.line, token.text));
            }
        }
    }
    fail_on(
        "the client address has one reader, `http::rate_limit::ClientAddress` \
         (ask `AppState::client_address`): anything else trusts headers any client can write",
        &offences,
    );
}

// ---------------------------------------------------------------------------

/// A module path from `a/b` text (`""` is the root).
fn m(path: &str) -> ModPath {
    path.split('/')
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

/// The modules a file depends on, as `a/b` names (self-check helper).
fn deps_of(me: &str, src: &str, modules: &[&str]) -> Vec<String> {
    let modules: BTreeSet<ModPath> = modules.iter().map(|p| m(p)).collect();
    dependencies(&m(me), src, &modules)
        .keys()
        .map(|k| mod_name(k))
        .collect()
}

/// The lexer: a `//` inside a string is not a comment; comments and literals are blanked, lines kept.
#[test]
fn self_check_lexer_blanks_comments_and_strings() {
    let src =
        "let u = \"http://x\"; let v = 1; // a comment\n/* a /* nested */ one */ let w = 2;\n";
    let code = code_only(src);
    assert!(code.contains("let v = 1;"), "{code:?}");
    assert!(code.contains("let w = 2;"), "{code:?}");
    assert!(!code.contains("http") && !code.contains("comment") && !code.contains("nested"));
    assert_eq!(code.lines().count(), src.lines().count());
    let raw = "let r = r#\"a \"quoted\" // x\"#; let b = b\"\\\"\"; let k = br##\"y\"#z\"##; ok();";
    let code = code_only(raw);
    assert!(code.contains("ok();"), "{code:?}");
    assert!(
        !code.contains('x') && !code.contains('y') && !code.contains('z'),
        "{code:?}"
    );
}

/// The lexer: a lifetime does not start a char literal; char literals (`'x'`, `'\''`, `b'"'`) are blanked.
#[test]
fn self_check_lifetimes_are_not_char_literals() {
    let src = "fn f<'a>(x: &'a str) -> char { let q = '\\''; let d = b'\"'; 'x' }\nfn g() { crate::http::go(); }";
    let code = code_only(src);
    assert!(code.contains("fn f<'a>(x: &'a str)"), "{code:?}");
    assert!(code.contains("crate::http::go();"), "{code:?}");
    assert!(!code.contains("'x'") && !code.contains('"'), "{code:?}");
    let tokens = tokenize(&code);
    assert!(
        tokens.iter().all(|t| t.text != "a"),
        "lifetimes are dropped"
    );
    assert_eq!(tokens.last().map(|t| t.line), Some(2));
    assert_eq!(deps_of("store", src, &["", "store", "http"]), ["http"]);
}

/// Paths in strings, comments and doc comments are not dependencies.
#[test]
fn self_check_a_path_in_a_string_is_not_a_dependency() {
    let src = "/// see crate::http::X\nfn f() { let s = \"crate::http::X\"; let r = r#\"crate::actors\"#; }\n/* crate::http /* crate::http */ crate::http */";
    assert!(deps_of("store", src, &["", "store", "http", "actors"]).is_empty());
}

/// Use trees (nested groups, `self`), child paths, attribute arguments and `use`d modules all count.
#[test]
fn self_check_paths_resolve_to_module_files() {
    let modules = [
        "", "a", "a/b", "a/c", "x", "x/y", "x/z", "k", "h", "h/o", "s", "s/t",
    ];
    let src = "use super::{x::{self, y}, k::Thing};\n\
               #[utoipa::path(post, body = super::h::o::ErrorBody)]\n\
               fn f() { c::go(); crate::x::z::Z::new(); }\n\
               #[schema(value_type = crate::s::t::Kind)]\nstruct S;";
    assert_eq!(
        deps_of("a", src, &modules),
        ["a/c", "h/o", "k", "s/t", "x", "x/y", "x/z"]
    );
    let aliased = "use crate::s;\nfn f() { s::t::go(); }";
    assert_eq!(deps_of("a", aliased, &modules), ["s", "s/t"]);
}

/// Inline modules resolve relative to themselves; `#[cfg(test)] mod tests`, self and ancestors are left out.
#[test]
fn self_check_inline_modules_tests_and_ancestors() {
    let modules = ["", "a", "a/b", "a/c", "x"];
    let src = "pub mod prelude {\n    pub use super::b::Entity;\n}\n\
               fn f() { super::super::x::go(); crate::a::Item; self::c::D; }\n\
               #[cfg(test)]\nmod tests {\n    use crate::x::y;\n    fn t() { crate::x::z(); }\n}\n\
               fn g() { super::a::Up; }";
    assert_eq!(deps_of("a/b", src, &modules), ["x"]);
    let parent = "pub mod prelude { pub use super::b::Entity; }";
    assert_eq!(deps_of("a", parent, &modules), ["a/b"]);
}

/// The cycle finder: each circle is one group; nodes off every circle are in none.
#[test]
fn self_check_cycle_finder() {
    let edges = [
        ("a", "b"),
        ("b", "c"),
        ("c", "a"),
        ("c", "d"),
        ("d", "e"),
        ("e", "d"),
        ("e", "f"),
        ("g", "g"),
    ];
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (from, to) in edges {
        graph.entry(from).or_default().insert(to);
        graph.entry(to).or_default();
    }
    assert_eq!(
        strongly_connected(&graph),
        vec![vec!["d", "e"], vec!["a", "b", "c"]]
    );
    graph.get_mut("f").unwrap().insert("a");
    assert_eq!(
        strongly_connected(&graph),
        vec![vec!["a", "b", "c", "d", "e", "f"]]
    );
}

/// Function lengths: from the `fn` line to its closing brace; one-liners and bodiless fns are right.
#[test]
fn self_check_function_lengths() {
    let src = "impl X {\n    pub(crate) async fn long(\n        a: [u8; 2],\n    ) {\n        let s = \"}\";\n    }\n    fn one() -> u8 { 1 }\n    fn decl(&self)\n    where\n        Self: Sized;\n}\n";
    let found = function_lengths(&code_only(src));
    let names: Vec<(usize, &str, usize)> = found
        .iter()
        .map(|(l, n, len)| (*l, n.as_str(), *len))
        .collect();
    assert_eq!(names, [(2, "long", 5), (7, "one", 1)]);
    assert_eq!(
        declared_fn("pub(in crate::a) const unsafe fn z()"),
        Some("z")
    );
    assert_eq!(declared_fn("pubfn z()"), None);
}
