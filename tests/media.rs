//! The media store (issue 33's first part): a local folder and a real
//! S3-compatible server (s3s-fs on 127.0.0.1, never a mock), each storing,
//! reading back, overwriting (the same key is the same object) and
//! deleting; and `/readyz`, which says when the store is down and recovers
//! when it is back.

mod support;

use std::time::Duration;

use bytes::Bytes;
use stagehand::media::{MediaError, MediaPlace, MediaStore};
use support::{wait_for, Backend, S3Server, TestApp};

/// What every place must do, the same way.
async fn keeps_overwrites_and_deletes(store: &MediaStore) {
    let key = format!("results/{}/0.png", uuid::Uuid::new_v4().simple());
    store
        .put(&key, Bytes::from_static(b"first"))
        .await
        .expect("put");
    store
        .put(&key, Bytes::from_static(b"second"))
        .await
        .expect("overwrite");
    assert_eq!(
        store.get(&key).await.expect("get"),
        Bytes::from_static(b"second")
    );
    store.delete(&key).await.expect("delete");
    store
        .delete(&key)
        .await
        .expect("a second delete is no error");
    assert!(
        matches!(store.get(&key).await, Err(MediaError::NotFound(_))),
        "gone after delete"
    );
    store
        .probe("instance-1")
        .await
        .expect("the probe writes and reads back");
}

#[tokio::test]
async fn a_local_folder_keeps_files() {
    let dir = tempfile::tempdir().unwrap();
    let store = MediaStore::open(&dir.path().display().to_string()).expect("open");
    assert_eq!(store.place(), &MediaPlace::Folder(dir.path().to_owned()));
    keeps_overwrites_and_deletes(&store).await;
}

#[tokio::test]
async fn an_s3_bucket_keeps_files() {
    S3Server::credentials_in_env();
    let s3 = S3Server::start("media").await;
    let store = MediaStore::open(&s3.media_url("media")).expect("open");
    assert!(matches!(store.place(), MediaPlace::S3 { bucket } if bucket == "media"));
    assert!(
        !store.describe().contains(support::S3_SECRET_KEY),
        "{}",
        store.describe()
    );
    keeps_overwrites_and_deletes(&store).await;
    // It is the server's: the object is a file in its folder.
    store
        .put("results/x/1.png", Bytes::from_static(b"kept"))
        .await
        .unwrap();
    let on_disk = std::fs::read(s3.root.path().join("media/results/x/1.png")).expect("the file");
    assert_eq!(on_disk, b"kept");
}

/// `/readyz` writes and reads a probe object: ready with the store up,
/// 503 naming the media store while it is down, ready again once it is
/// back.
async fn readyz_says_when_the_media_store_is_down(backend: Backend) {
    S3Server::credentials_in_env();
    let mut s3 = S3Server::start("media").await;
    let url = s3.media_url("media");
    let app = TestApp::spawn_with(backend, support::fast_sim(), move |c| {
        c.media_url = Some(url);
    })
    .await;
    let ready = || async {
        let resp = app
            .http
            .get(format!("{}/readyz", app.base))
            .send()
            .await
            .expect("GET /readyz");
        let status = resp.status().as_u16();
        (status, resp.text().await.unwrap_or_default())
    };
    assert_eq!(ready().await.0, 200);
    s3.stop();
    let (status, body) = ready().await;
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("media store"), "says what is down: {body}");
    assert!(body.contains("s3://media"), "and which: {body}");
    assert!(!body.contains(support::S3_SECRET_KEY), "{body}");
    s3.resume().await;
    let back = wait_for(Duration::from_secs(10), || async {
        (ready().await.0 == 200).then_some(())
    })
    .await;
    assert!(back.is_some(), "ready again once the store is back");
    app.stop().await;
}
db_test!(readyz_says_when_the_media_store_is_down);

/// Kept files are served as they are read from the store, never held
/// whole: eight guests opening a 40 MB result at once (and reading only
/// its start, as a phone on a slow network does) leave the server's peak
/// memory within a few MB of where it was, where a copy each would take
/// 320 MB. A range still comes exact. In a server of its own, whose
/// `VmHWM` is read.
#[actix_web::test]
async fn a_large_result_is_served_streamed() {
    let db = support::TestDb::fresh(Backend::Sqlite).await;
    let sim = support::start_sim(support::fast_sim()).await;
    let mut logs = support::Logs::new();
    let http = support::http_client();
    let server = support::Server::start(&db.url, &sim.url(), &logs.next(), &http).await;
    let name = format!("{}.mp4", uuid::Uuid::new_v4().simple());
    let folder = std::path::PathBuf::from(support::media_folder_of(&db.url)).join("r");
    std::fs::create_dir_all(&folder).expect("the results folder");
    let size = 40 * 1024 * 1024;
    let file: Vec<u8> = (0..size).map(|i| (i % 251) as u8).collect();
    std::fs::write(folder.join(&name), &file).expect("a large kept file");
    let url = format!("{}/media/r/{name}", server.base);
    let before = support::peak_rss_kib(server.pid);
    let mut open = Vec::new();
    for _ in 0..8 {
        let mut resp = http.get(&url).send().await.expect("GET");
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.content_length(), Some(size as u64));
        let first = resp.chunk().await.expect("a first chunk").expect("bytes");
        assert_eq!(first[..16], file[..16]);
        open.push(resp);
    }
    let range = http
        .get(&url)
        .header("Range", "bytes=1000000-1000099")
        .send()
        .await
        .expect("GET a range");
    assert_eq!(range.status(), 206);
    assert_eq!(
        range.bytes().await.expect("the range")[..],
        file[1_000_000..1_000_100]
    );
    let after = support::peak_rss_kib(server.pid);
    println!("serving 8 × 40 MB: VmHWM {before} KiB before, {after} KiB after");
    assert!(
        after < before + 32 * 1024,
        "not held whole: VmHWM went from {before} KiB to {after} KiB"
    );
    drop(open);
}
