use super::*;

#[test]
fn a_commit_wakes_the_waits_it_reaches_and_no_other() {
    let mut followed = Followed::default();
    let mut woken: Vec<(i64, oneshot::Receiver<i64>)> = Vec::new();
    for offset in [5, 9, 9, 12] {
        let (wake, rx) = oneshot::channel();
        followed.waits.entry(offset).or_default().push(wake);
        woken.push((offset, rx));
    }
    followed.seen(10);
    let answers: Vec<(i64, Option<i64>)> = woken.iter_mut().map(|(offset, rx)| (*offset, rx.try_recv().ok())).collect();
    assert_eq!(answers, [(5, Some(10)), (9, Some(10)), (9, Some(10)), (12, None)], "offsets below 10 are applied");
    followed.seen(8);
    assert_eq!(followed.next, Some(10), "never moves back");
    assert!(followed.prune(), "the wait for 12 is still there");
    drop(woken);
    assert!(!followed.prune(), "a wait that gave up is forgotten");
    followed.seen(13);
    assert_eq!(followed.next, Some(13));
}
