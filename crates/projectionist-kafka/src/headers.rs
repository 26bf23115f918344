//! A message's headers read as they are on the wire. rdkafka's `Headers` panics on a header
//! name that is not UTF-8 (its `try_get` unwraps `to_str`), and librdkafka or a Go producer
//! can write one: the names are read here as bytes, through librdkafka's C API.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::ptr;

use projectionist_postgres::park::Headers;
use rdkafka::bindings as rd;
use rdkafka::message::BorrowedMessage;
use rdkafka::types::RDKafkaRespErr;

/// The headers of `message`: each name's bytes and its value (`None`: a header without one).
pub(crate) fn read(message: &BorrowedMessage<'_>) -> Headers {
    let mut list: *mut rd::rd_kafka_headers_t = ptr::null_mut();
    // SAFETY: `message.ptr()` is the librdkafka message `message` borrows, alive for this
    // call; the list librdkafka gives back is owned by that message.
    let err = unsafe { rd::rd_kafka_message_headers(message.ptr(), &mut list) };
    if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || list.is_null() {
        return Vec::new();
    }
    // SAFETY: `list` is the message's header list, checked non-null above.
    let count = unsafe { rd::rd_kafka_header_cnt(list) };
    (0..count).filter_map(|idx| header(list, idx)).collect()
}

/// Header `idx` of `list`, copied out.
fn header(list: *const rd::rd_kafka_headers_t, idx: usize) -> Option<(Vec<u8>, Option<Vec<u8>>)> {
    let (mut name, mut value, mut size) = (ptr::null(), ptr::null(), 0usize);
    // SAFETY: `list` is a live header list and `idx` below its count; librdkafka fills the
    // three pointers with its own storage, valid while the message lives.
    let err = unsafe { rd::rd_kafka_header_get_all(list, idx, &mut name, &mut value, &mut size) };
    if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR || name.is_null() {
        return None;
    }
    // SAFETY: librdkafka keeps each name NUL-terminated; `name` is non-null.
    let name = unsafe { CStr::from_ptr(name) }.to_bytes().to_vec();
    // SAFETY: a non-null `value` points at `size` bytes of the header's value.
    let value = (!value.is_null()).then(|| unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) }.to_vec());
    Some((name, value))
}
