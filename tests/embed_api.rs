//! The embedding API (`vkfuse_runtime::Session`) on a schedule file compiled from a fixture:
//! the example program's greedy ids equal transformers', K steps per submit give the same ids,
//! replay's counters show no per-token host work, a generation cut short resumes where it
//! stopped, misuse is a clear error, and validation stays clean.

#[path = "../runtime/examples/embed.rs"]
#[allow(dead_code)] // its main() and run() are the example's, not the test's
mod embed;

use std::path::PathBuf;
use vkfuse_runtime::{Backend, Session, SessionError, SessionOptions};
use vkfuse_tests::{expected, fixture_dir, write_fixture_file};

const FIXTURE: &str = "qwen3-tied";

fn schedule_file(tag: &str) -> PathBuf {
    let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("embed-{tag}-{}.vkf", std::process::id()));
    write_fixture_file(FIXTURE, &path);
    path
}

fn options(backend: Backend, tokens_per_submit: u32) -> SessionOptions {
    SessionOptions {
        backend,
        tokens_per_submit,
        validation: true,
        ..SessionOptions::default()
    }
}

#[test]
fn embedded_session_generates_transformers_greedy_ids() {
    let path = schedule_file("greedy");
    let want = expected(FIXTURE);
    let n = want.greedy_ids.len();
    let mut session = Session::open(&path, &options(Backend::Replay, 1)).unwrap();
    let log = session.device().validation_log();

    // compile-model recorded the model's tokenizer.json verbatim.
    let tokenizer = std::fs::read_to_string(fixture_dir(FIXTURE).join("tokenizer.json")).unwrap();
    assert_eq!(session.tokenizer_json(), Some(tokenizer.as_str()));

    let mut out = Vec::new();
    let ids = embed::decode(&mut session, &want.prompt_ids, n, &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    assert_eq!(
        ids, want.greedy_ids,
        "embedded replay vs transformers\n{text}"
    );
    assert_eq!(text.lines().count(), 1 + n + 2, "{text}");
    assert!(text.contains("generated: "), "{text}");

    // Replay: no descriptor write and no recording after load, one submit per step.
    let c = session.counters();
    assert_eq!(c.tokens as usize, want.prompt_ids.len() + n - 1);
    assert_eq!((c.descriptor_writes, c.recordings), (0, 0), "{c:?}");
    assert_eq!(c.submits, c.tokens);
    let per = c.per_token().unwrap();
    assert_eq!(per.submits_per_token, 1.0);
    assert!(per.dispatches_per_token > 0.0);

    // A new sequence gives the same ids.
    session.reset().unwrap();
    assert_eq!(session.position().unwrap(), 0);
    session.feed(&want.prompt_ids).unwrap();
    let again: Vec<u32> = session.generate(n).collect::<Result<_, _>>().unwrap();
    assert_eq!(again, want.greedy_ids);

    drop(session);
    std::fs::remove_file(&path).ok();
    assert!(log.is_clean(), "{}", log.report());
}

/// A warm-up step leaves a fresh sequence and counters that start after it; it is refused once
/// a sequence has started.
#[test]
fn warm_up_leaves_a_fresh_sequence_and_counters() {
    let path = schedule_file("warm");
    let want = expected(FIXTURE);
    let n = want.greedy_ids.len();
    for (backend, k) in [(Backend::Replay, 8u32), (Backend::Eager, 1)] {
        let mut session = Session::open(&path, &options(backend, k)).unwrap();
        let log = session.device().validation_log();
        session.warm_up().unwrap();
        assert_eq!(session.position().unwrap(), 0, "{backend:?}");
        let c = session.counters();
        assert_eq!(
            (c.tokens, c.submits, c.wall_ns),
            (0, 0, 0),
            "{backend:?}: {c:?}"
        );
        assert!(c.gpu_ns.is_none_or(|ns| ns == 0), "{backend:?}: {c:?}");
        session.feed(&want.prompt_ids).unwrap();
        let ids: Vec<u32> = session.generate(n).collect::<Result<_, _>>().unwrap();
        assert_eq!(ids, want.greedy_ids, "{backend:?} after a warm-up");
        let c = session.counters();
        assert_eq!(
            c.tokens as usize,
            want.prompt_ids.len() + n - 1,
            "{backend:?}"
        );
        let again = session.warm_up().unwrap_err().to_string();
        assert!(again.contains("before the first feed"), "{again}");
        drop(session);
        assert!(log.is_clean(), "{backend:?}: {}", log.report());
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn chained_steps_and_eager_give_the_same_ids() {
    let path = schedule_file("chained");
    let want = expected(FIXTURE);
    let n = want.greedy_ids.len();
    let prompt = want.prompt_ids.len() as u64;
    for (backend, k) in [(Backend::Replay, 8u32), (Backend::Eager, 1)] {
        let mut session = Session::open(&path, &options(backend, k)).unwrap();
        let log = session.device().validation_log();
        let last = session.feed(&want.prompt_ids).unwrap();
        assert_eq!(last.logits.len(), 372);
        assert_eq!(last.next_token, want.greedy_ids[0]);
        let ids: Vec<u32> = session.generate(n).collect::<Result<_, _>>().unwrap();
        assert_eq!(ids, want.greedy_ids, "{backend:?} K={k}");
        let c = session.counters();
        assert_eq!(
            c.tokens,
            prompt + n as u64 - 1,
            "exactly the steps asked for"
        );
        if backend == Backend::Replay {
            // The prompt one submit per id, then ceil((n - 1) / 8) chains; only the shorter
            // last chain is recorded during the session.
            let chains = (n as u64 - 1).div_ceil(8);
            assert_eq!(c.submits, prompt + chains, "{c:?}");
            assert_eq!((c.descriptor_writes, c.recordings), (0, 1), "{c:?}");
        } else {
            assert_eq!(c.recordings, c.tokens, "eager records every step");
        }
        drop(session);
        assert!(log.is_clean(), "{backend:?}: {}", log.report());
    }
    std::fs::remove_file(&path).ok();
}

#[test]
fn a_generation_cut_short_resumes_and_misuse_is_a_clear_error() {
    let path = schedule_file("misuse");
    let want = expected(FIXTURE);
    let n = 12;
    let mut session = Session::open(&path, &options(Backend::Replay, 8)).unwrap();
    let log = session.device().validation_log();

    let err = session.generate(3).next().unwrap().unwrap_err();
    assert!(
        err.to_string().contains("feed at least one prompt id"),
        "{err}"
    );
    let err = session.feed(&[]).unwrap_err();
    assert!(matches!(err, SessionError::Request(_)), "{err}");
    let err = session.feed(&[1, 372]).unwrap_err();
    assert!(
        matches!(
            err,
            SessionError::TokenOutOfRange {
                token: 372,
                vocab: 372
            }
        ),
        "{err}"
    );
    assert_eq!(
        session.position().unwrap(),
        0,
        "nothing ran for a bad prompt"
    );

    session.feed(&want.prompt_ids).unwrap();
    // Two ids read, but the chain computed eight: six wait, already in the KV cache.
    let first: Vec<u32> = session
        .generate(n)
        .take(2)
        .collect::<Result<_, _>>()
        .unwrap();
    let err = session.feed(&[5]).unwrap_err();
    assert!(matches!(err, SessionError::RanAhead { tokens: 6 }), "{err}");
    assert!(err.to_string().contains("reset()"), "{err}");
    let rest: Vec<u32> = session.generate(n - 2).collect::<Result<_, _>>().unwrap();
    assert_eq!([first, rest].concat(), want.greedy_ids[..n]);

    drop(session);
    for (opts, needle) in [
        (
            options(Backend::Replay, 0),
            "tokens per submit must be in 1..=64",
        ),
        (options(Backend::Eager, 4), "needs the replay backend"),
    ] {
        let err = Session::open(&path, &opts).err().unwrap();
        assert!(err.to_string().contains(needle), "{err}");
    }
    let missing = path.with_extension("missing");
    let err = Session::open(&missing, &SessionOptions::default())
        .err()
        .unwrap();
    assert!(matches!(err, SessionError::File(_)), "{err}");
    assert!(err.to_string().contains("embed-misuse"), "{err}");
    std::fs::remove_file(&path).ok();
    assert!(log.is_clean(), "{}", log.report());
}

#[test]
fn the_pipeline_cache_file_is_written_then_used_and_a_damaged_one_is_ignored() {
    use vkfuse_runtime::session::{pipeline_cache, CacheStatus};
    let path = schedule_file("cache");
    let mut cache = path.clone().into_os_string();
    cache.push(".pipelines");
    let cache = PathBuf::from(cache);
    let _ = std::fs::remove_file(&cache);
    // The user cache folder is the fallback a missing file beside the schedule is read from:
    // an entry for this schedule left there (by a run of it from a read-only folder, say)
    // would be used, not written.
    let checksum = {
        let file = vkfuse_runtime::schedule::ScheduleFile::open(&path).unwrap();
        pipeline_cache::schedule_checksum(file.schedule())
    };
    if let Some(user) = pipeline_cache::CacheFile::in_user_cache(checksum) {
        let _ = std::fs::remove_file(&user.primary);
    }
    let want = expected(FIXTURE);
    let ids_of = |session: &mut Session| {
        let mut out = Vec::new();
        embed::decode(session, &want.prompt_ids, want.greedy_ids.len(), &mut out).unwrap()
    };

    // First load: compiled, and the cache written beside the schedule.
    let mut first = Session::open(&path, &options(Backend::Replay, 1)).unwrap();
    assert_eq!(first.pipeline_cache(), &CacheStatus::Written(cache.clone()));
    let size = std::fs::metadata(&cache).unwrap().len();
    assert!(size > 64, "cache file of {size} bytes");
    assert_eq!(ids_of(&mut first), want.greedy_ids);
    drop(first);

    // Second load: the pipelines come from the file; the results are the same.
    let mut second = Session::open(&path, &options(Backend::Replay, 1)).unwrap();
    assert_eq!(second.pipeline_cache(), &CacheStatus::Used(cache.clone()));
    assert_eq!(ids_of(&mut second), want.greedy_ids);
    let log = second.device().validation_log();
    assert!(log.is_clean(), "{}", log.report());
    drop(second);

    // A damaged file: a warning, never a failure; then it is rewritten.
    let mut bytes = std::fs::read(&cache).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&cache, &bytes).unwrap();
    let mut third = Session::open(&path, &options(Backend::Replay, 1)).unwrap();
    let warning = third.pipeline_cache().warning().expect("a warning");
    assert!(
        warning.contains("checksum mismatch") && warning.contains(".pipelines"),
        "{warning}"
    );
    assert_eq!(ids_of(&mut third), want.greedy_ids);
    drop(third);
    let again = Session::open(&path, &options(Backend::Replay, 1)).unwrap();
    assert_eq!(again.pipeline_cache(), &CacheStatus::Used(cache));
}

/// A folder where the pipeline cache file should be: the cache goes to the fallback, and the
/// warning says where (not only that the folder could not be read).
#[test]
fn a_pipeline_cache_in_the_way_says_where_the_cache_went() {
    use vkfuse_runtime::session::{CacheFile, LoadOptions, Loaded};
    let (model, schedule) = vkfuse_tests::fixture_schedule(FIXTURE);
    let dir = std::env::temp_dir().join(format!("vkfuse-cache-in-the-way-{}", std::process::id()));
    let folder = dir.join("s.vkf.pipelines");
    std::fs::create_dir_all(&folder).unwrap();
    let elsewhere = dir.join("fallback.pipelines");
    let (device, log) = vkfuse_tests::validated_device();
    let options = LoadOptions {
        pipeline_cache: Some(CacheFile {
            primary: folder.clone(),
            fallback: Some(elsewhere.clone()),
        }),
        ..LoadOptions::default()
    };
    let loaded = Loaded::load(device, schedule, &model.tensors, options).unwrap();
    let warning = loaded.pipeline_cache.warning().expect("a warning");
    assert!(
        warning.contains(&folder.display().to_string())
            && warning.contains(&format!("written to {} instead", elsewhere.display())),
        "{warning}"
    );
    assert!(elsewhere.is_file());
    drop(loaded);
    std::fs::remove_dir_all(&dir).ok();
    assert!(log.is_clean(), "{}", log.report());
}
